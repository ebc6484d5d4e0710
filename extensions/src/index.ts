/**
 * Training Workbench for JupyterLab: a "Workbench" side panel with live device
 * charts, a status-bar utilization item, and a "New tuning notebook" command on
 * the launcher, palette and panel. One plugin: the three share one metrics poller.
 */

import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { IStatusBar } from '@jupyterlab/statusbar';

import { workbenchIcon } from './icons';
import { MetricsModel } from './model';
import { copyQuickstart } from './notebook';
import { WorkbenchPanel } from './panel';
import { WorkbenchStatus } from './status';
import { WatchedJobsModel } from './watched';

/** Command ids, stable: users bind keys to them. */
export namespace CommandIDs {
  export const newNotebook = 'training-workbench:new-tuning-notebook';
  export const openPanel = 'training-workbench:open-panel';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'training-workbench:plugin',
  description: 'Live device panel, status-bar utilization and a New tuning notebook launcher card.',
  autoStart: true,
  requires: [ILabShell],
  optional: [ILayoutRestorer, IStatusBar, ILauncher, ICommandPalette, IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    launcher: ILauncher | null,
    palette: ICommandPalette | null,
    browser: IDefaultFileBrowser | null
  ) => {
    const model = new MetricsModel();

    app.commands.addCommand(CommandIDs.newNotebook, {
      label: 'New tuning notebook',
      caption: 'Copy the Training Workbench quickstart notebook into this folder and open it',
      icon: args => (args.isPalette ? undefined : workbenchIcon),
      execute: async args => {
        // The launcher passes its folder as `cwd`; elsewhere, the file browser's.
        const folder = typeof args.cwd === 'string' ? args.cwd : (browser?.model.path ?? '');
        try {
          const path = await copyQuickstart(app.serviceManager.contents, folder);
          return await app.commands.execute('docmanager:open', { path, factory: 'Notebook' });
        } catch (reason) {
          await showErrorMessage('Cannot create the tuning notebook', reason as Error);
          return undefined;
        }
      }
    });

    const panel = new WorkbenchPanel({
      model,
      watched: new WatchedJobsModel(),
      onNewNotebook: () => void app.commands.execute(CommandIDs.newNotebook)
    });
    panel.title.icon = workbenchIcon;
    panel.title.label = shell.mode === 'single-document' ? 'Workbench' : '';
    shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);

    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show Workbench device panel',
      execute: () => shell.activateById(panel.id)
    });

    if (statusBar) {
      const item = new WorkbenchStatus({ model, onClick: () => shell.activateById(panel.id) });
      statusBar.registerStatusItem('training-workbench:status', { item, align: 'left', rank: 100 });
    }
    launcher?.add({ command: CommandIDs.newNotebook, category: 'Training Workbench', rank: 0 });
    if (palette) {
      palette.addItem({ command: CommandIDs.newNotebook, category: 'Training Workbench', args: { isPalette: true } });
      palette.addItem({ command: CommandIDs.openPanel, category: 'Training Workbench' });
    }
  }
};

export default plugin;
