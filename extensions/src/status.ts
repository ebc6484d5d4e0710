/**
 * The status-bar item: the busiest GPU's utilization and memory (or CPU and RAM),
 * always visible; clicking it opens the side panel.
 */

import { Widget } from '@lumino/widgets';

import { statusText } from './metrics';
import { MetricsModel } from './model';

export class WorkbenchStatus extends Widget {
  constructor(options: { model: MetricsModel; onClick: () => void }) {
    super();
    this._model = options.model;
    this.addClass('jp-WorkbenchStatus');
    this.node.title = 'Training Workbench — click to open the device panel';
    this.node.addEventListener('click', () => options.onClick());
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    this.node.textContent = this._model.error ? 'Workbench: offline' : statusText(this._model.series.latest);
  }

  private _model: MetricsModel;
}
