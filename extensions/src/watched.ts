/**
 * Watched jobs in the side panel: the user's own training loops (`wb.watch`), from any
 * process — a terminal, torchrun, a notebook. The server reads them from the run history
 * the jobs write about once a second (`workbench/api/watch`); this polls it twice a second
 * while the panel is shown, so a step shows here within the writer's flush plus one poll.
 */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { requestAPI } from './api';

/** One watched run as `workbench/api/watch` serves it (mirrors `sources.list_watched`). */
export interface IWatchedJob {
  run_id: number;
  name: string;
  status: string;
  message: string;
  rank: number | null;
  world_size: number | null;
  job: string | null;
  host: string | null;
  started_at: number;
  heartbeat_at: number;
  last_step: number;
  steady_median_ms: number | null;
  step: {
    step: number;
    wall_time: number;
    step_ms: number | null;
    data_ms: number | null;
    peak_memory_bytes: number | null;
    loss: number | null;
  } | null;
  /** The newest profiled window (or open request), with the diagnosis's primary finding once done. */
  profile: {
    id: number;
    status: string;
    first_step: number | null;
    last_step: number | null;
    message: string;
    finding: string | null;
    summary: string | null;
    fix: string | null;
  } | null;
  /** Under torchrun: the launch read as one — its state, the rank that failed first, the straggler line. */
  launch?: {
    status: string;
    first_failed_rank: number | null;
    straggler: number | null;
    pace: string;
  } | null;
}

export interface IWatchReply {
  jobs: IWatchedJob[];
  store: string | null;
  note: string;
}

/** The job's title: its name, and its rank under torchrun. */
export function jobTitle(job: IWatchedJob): string {
  return job.rank === null ? job.name : `${job.name} · rank ${job.rank}/${job.world_size ?? '?'}`;
}

/** One line: state, step, step time with its data wait, memory, loss. */
export function jobLine(job: IWatchedJob): string {
  const parts = [job.status, `step ${job.last_step}`];
  const step = job.step;
  if (step && step.step_ms !== null) {
    const wait = step.data_ms !== null ? ` (data ${formatMs(step.data_ms)})` : '';
    parts.push(`${formatMs(step.step_ms)}/step${wait}`);
  }
  if (job.steady_median_ms !== null) {
    parts.push(`median ${formatMs(job.steady_median_ms)}`);
  }
  if (step && step.peak_memory_bytes !== null) {
    parts.push(`peak ${formatBytes(step.peak_memory_bytes)}`);
  }
  if (step && step.loss !== null) {
    parts.push(`loss ${step.loss.toPrecision(4)}`);
  }
  if (job.message) {
    parts.push(job.message);
  }
  return parts.join(' · ');
}

/** The newest profiled window in a line: under way, or its finding and the first fix to try. */
export function profileLine(job: IWatchedJob): string {
  const window = job.profile;
  if (!window) {
    return '';
  }
  if (window.status === 'requested' || window.status === 'started') {
    return 'profiling the next steps…';
  }
  const where = window.first_step !== null ? `steps ${window.first_step}–${window.last_step}: ` : '';
  if (window.status !== 'done') {
    return `${where}profile ${window.status}${window.message ? ` (${window.message})` : ''}`;
  }
  if (!window.finding) {
    return `${where}no bottleneck found`;
  }
  return `${where}${window.finding}${window.fix ? ` — try: ${window.fix}` : ''}`;
}

/** A torchrun launch in a line: the rank that failed first, then the straggler (who, and why) or why none. */
export function launchLine(job: IWatchedJob): string {
  const launch = job.launch;
  if (!launch) {
    return '';
  }
  const failed = launch.first_failed_rank !== null ? `failed: rank ${launch.first_failed_rank} first · ` : '';
  return `${failed}${launch.pace}`;
}

/** Ask a running job to profile its next steps (it takes the request within about a second). */
export async function requestProfile(runId: number, steps = 5): Promise<void> {
  await requestAPI(`watch/${runId}/profile`, { steps }, { method: 'POST' });
}

export function formatMs(ms: number): string {
  return ms >= 100 ? `${ms.toFixed(0)} ms` : `${ms.toFixed(1)} ms`;
}

export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export class WatchedJobsModel {
  constructor(options: { intervalMs?: number; limit?: number } = {}) {
    this._limit = options.limit ?? 20;
    this._poll = new Poll({
      auto: false, // the panel starts it when shown and stops it when hidden
      factory: () => this._refresh(),
      frequency: { interval: options.intervalMs ?? 500, backoff: true, max: 30_000 },
      name: 'training-workbench:watch',
      standby: 'when-hidden'
    });
  }

  get jobs(): IWatchedJob[] {
    return this._jobs;
  }

  get note(): string {
    return this._note;
  }

  get error(): string {
    return this._error;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  start(): Promise<void> {
    return this._poll.start();
  }

  stop(): Promise<void> {
    return this._poll.stop();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _refresh(): Promise<void> {
    let reply: IWatchReply;
    try {
      reply = await requestAPI<IWatchReply>('watch', { limit: this._limit });
    } catch (reason) {
      const message = reason instanceof Error ? reason.message : String(reason);
      if (message !== this._error) {
        this._error = message;
        this._changed.emit();
      }
      throw reason; // lets the Poll back off
    }
    const text = JSON.stringify(reply);
    if (text !== this._last || this._error) {
      this._last = text;
      this._jobs = reply.jobs;
      this._note = reply.note;
      this._error = '';
      this._changed.emit();
    }
  }

  private _limit: number;
  private _poll: Poll;
  private _jobs: IWatchedJob[] = [];
  private _note = '';
  private _error = '';
  private _last = '';
  private _changed = new Signal<this, void>(this);
}
