/**
 * The "Workbench" side panel: one live chart per GPU (or the host's CPU and RAM
 * when there is no GPU, with the reason), and a button into a tuning notebook.
 * It only draws; polling lives in `MetricsModel`, shared with the status bar.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { DeviceChart } from './chart';
import { MetricsModel } from './model';

export class WorkbenchPanel extends Widget {
  constructor(options: { model: MetricsModel; onNewNotebook: () => void }) {
    super();
    this._model = options.model;
    this.id = 'training-workbench-panel';
    this.addClass('jp-WorkbenchPanel');
    this.title.caption = 'Training Workbench: live device utilization and memory';

    const header = document.createElement('header');
    header.className = 'jp-WorkbenchPanel-header';
    const heading = document.createElement('h2');
    heading.textContent = 'Workbench';
    const button = document.createElement('button');
    button.className = 'jp-WorkbenchPanel-new jp-mod-styled jp-mod-accept';
    button.textContent = 'New tuning notebook';
    button.addEventListener('click', () => options.onNewNotebook());
    header.append(heading, button);

    this._note = document.createElement('p');
    this._note.className = 'jp-WorkbenchPanel-note';
    this._charts = document.createElement('div');
    this._charts.className = 'jp-WorkbenchPanel-charts';
    this.node.append(header, this._note, this._charts);

    this._model.changed.connect(this._onChanged, this);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._onChanged, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._render();
    void this._model.refresh();
  }

  private _onChanged(): void {
    if (this.isVisible) {
      this._render(); // a hidden panel redraws when shown, not every second
    }
  }

  private _render(): void {
    const model = this._model;
    const notes: string[] = [];
    if (model.error) {
      notes.push(`Cannot read metrics: ${model.error}`);
    }
    if (model.gpuReason) {
      notes.push(`No GPU shown: ${model.gpuReason}`);
    }
    this._note.textContent = notes.join(' ');
    this._note.hidden = notes.length === 0;

    const charts = model.series.charts();
    const wanted = new Set(charts.map(c => c.id));
    for (const [id, chart] of this._chartWidgets) {
      if (!wanted.has(id)) {
        chart.dispose();
        this._chartWidgets.delete(id);
      }
    }
    for (const data of charts) {
      let chart = this._chartWidgets.get(data.id);
      if (!chart) {
        chart = new DeviceChart(data.id);
        this._chartWidgets.set(data.id, chart);
        Widget.attach(chart, this._charts);
      }
      chart.render(data, model.series.windowS);
    }
    if (charts.length === 0 && !model.error) {
      this._charts.dataset.state = 'waiting';
    } else {
      delete this._charts.dataset.state;
    }
  }

  private _model: MetricsModel;
  private _note: HTMLElement;
  private _charts: HTMLElement;
  private _chartWidgets = new Map<string, DeviceChart>();
}
