/**
 * One poller shared by the side panel and the status bar, so a page asks the
 * server once per second however many views are open. It asks only for samples
 * newer than the last one kept (`since`), and pauses while the browser tab is
 * hidden; failures back off instead of hammering a restarting server.
 */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { requestAPI } from './api';
import { IMetricsReply, SeriesStore } from './metrics';

export class MetricsModel {
  constructor(options: { intervalMs?: number; windowS?: number } = {}) {
    this.series = new SeriesStore(options.windowS ?? 120);
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: { interval: options.intervalMs ?? 1000, backoff: true, max: 30_000 },
      name: 'training-workbench:metrics',
      standby: 'when-hidden'
    });
  }

  /** The charts' points and the newest sample. */
  readonly series: SeriesStore;

  /** Emitted after each poll that changed something (new samples or a new error). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Why GPUs are not shown (no NVML, no driver), from the server; '' when they are. */
  get gpuReason(): string {
    return this._gpuReason;
  }

  /** The last request's failure, '' after a success. */
  get error(): string {
    return this._error;
  }

  /** Ask now instead of at the next tick (the panel does this when it is shown). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _refresh(): Promise<void> {
    const since = this.series.lastT;
    const query: Record<string, number> = { window: this.series.windowS };
    if (since !== null) {
      query.since = since;
    }
    let reply: IMetricsReply;
    try {
      reply = await requestAPI<IMetricsReply>('metrics', query);
    } catch (reason) {
      const message = reason instanceof Error ? reason.message : String(reason);
      if (message !== this._error) {
        this._error = message;
        this._changed.emit();
      }
      throw reason; // lets the Poll back off
    }
    const added = this.series.add(reply.history);
    const wasError = this._error !== '';
    this._error = '';
    this._gpuReason = reply.gpu_available ? '' : reply.gpu_reason;
    if (added > 0 || wasError) {
      this._changed.emit();
    }
  }

  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
  private _error = '';
  private _gpuReason = '';
}
