/**
 * The data handling behind the panel and the status bar, free of any DOM or
 * JupyterLab import so it can be unit-tested on its own.
 *
 * The server sends samples as they come from the device monitor (one per GPU plus
 * the host); here they become one chart per device (utilization % and memory %
 * over time), bounded in length, with repeated samples from overlapping polls
 * dropped. The shapes mirror `workbench/jupyter/feed.py` (API version 1).
 */

/** One GPU in one sample; fields are null where NVML could not read them. */
export interface IGpuSample {
  index: number;
  name: string;
  util_pct: number | null;
  mem_used_bytes: number | null;
  mem_total_bytes: number | null;
  power_w?: number | null;
  temp_c?: number | null;
}

/** The host (CPU and RAM) in one sample. */
export interface IHostSample {
  cpu_pct: number | null;
  ram_used_bytes: number | null;
  ram_total_bytes: number | null;
  rss_bytes?: number | null;
}

/** One reading of the device monitor; `t` is Unix time in seconds. */
export interface ISample {
  t: number;
  gpus: IGpuSample[];
  host: IHostSample;
}

/** `GET workbench/api/metrics`: the newest sample and the history after `since`. */
export interface IMetricsReply {
  api_version: number;
  now: number;
  rate_hz: number;
  window_s: number;
  gpu_available: boolean;
  gpu_reason: string;
  latest: ISample | null;
  history: ISample[];
}

/** One point of a chart: time (s) and two percentages (null = not measured). */
export interface IPoint {
  t: number;
  util: number | null;
  mem: number | null;
}

/** What one chart shows: a device, its current reading and its recent points. */
export interface IChartData {
  id: string;
  title: string;
  utilLabel: string;
  memLabel: string;
  current: { util: number | null; memUsed: number | null; memTotal: number | null };
  points: IPoint[];
}

/** Charts show GPUs when there are any; without a GPU, the host stands in. */
export function devicesOf(sample: ISample): { id: string; title: string; utilLabel: string; memLabel: string }[] {
  if (sample.gpus.length > 0) {
    return sample.gpus.map(gpu => ({
      id: `gpu${gpu.index}`,
      title: `GPU ${gpu.index} · ${gpu.name}`,
      utilLabel: 'utilization',
      memLabel: 'memory'
    }));
  }
  return [{ id: 'host', title: 'Host CPU / RAM', utilLabel: 'CPU', memLabel: 'RAM' }];
}

/** The reading of one chart's device in one sample, as percentages and bytes. */
export function readingOf(
  sample: ISample,
  id: string
): { util: number | null; memUsed: number | null; memTotal: number | null } | null {
  if (id === 'host') {
    if (sample.gpus.length > 0) {
      return null;
    }
    const host = sample.host;
    return { util: host.cpu_pct, memUsed: host.ram_used_bytes, memTotal: host.ram_total_bytes };
  }
  const gpu = sample.gpus.find(g => `gpu${g.index}` === id);
  if (!gpu) {
    return null;
  }
  return { util: gpu.util_pct, memUsed: gpu.mem_used_bytes, memTotal: gpu.mem_total_bytes };
}

/** Used ÷ total as a percentage, or null when either is unknown (a zero total is unknown, not 0 %). */
export function percentOf(used: number | null, total: number | null): number | null {
  if (used === null || total === null || !(total > 0)) {
    return null;
  }
  return Math.min(100, Math.max(0, (100 * used) / total));
}

/**
 * Keeps the recent points of every chart across polls.
 *
 * Polls overlap (the server answers "everything after `since`", and a retried or
 * slow request can repeat samples), so a sample not newer than the last one kept
 * is ignored; points older than `windowS` before the newest are dropped so a
 * panel left open for days stays small.
 */
export class SeriesStore {
  constructor(windowS = 120) {
    this.windowS = windowS;
  }

  readonly windowS: number;

  /** Time of the newest sample kept; the next poll asks for samples after it. */
  get lastT(): number | null {
    return this._lastT;
  }

  /** The newest sample kept (the status bar shows it). */
  get latest(): ISample | null {
    return this._latest;
  }

  /** Add samples (any order, repeats allowed); returns how many were new. */
  add(samples: ISample[]): number {
    const sorted = samples.filter(s => Number.isFinite(s.t)).sort((a, b) => a.t - b.t);
    let added = 0;
    for (const sample of sorted) {
      if (this._lastT !== null && sample.t <= this._lastT) {
        continue; // already kept, or two samples with one timestamp
      }
      this._append(sample);
      added += 1;
    }
    this._trim();
    return added;
  }

  /** The charts to draw, in device order, each with its points oldest first. */
  charts(): IChartData[] {
    if (!this._latest) {
      return [];
    }
    const latest = this._latest;
    return devicesOf(latest).map(device => {
      const reading = readingOf(latest, device.id) ?? { util: null, memUsed: null, memTotal: null };
      return { ...device, current: reading, points: this._points.get(device.id) ?? [] };
    });
  }

  private _append(sample: ISample): void {
    for (const device of devicesOf(sample)) {
      const reading = readingOf(sample, device.id);
      if (!reading) {
        continue;
      }
      let points = this._points.get(device.id);
      if (!points) {
        points = [];
        this._points.set(device.id, points);
      }
      points.push({ t: sample.t, util: reading.util, mem: percentOf(reading.memUsed, reading.memTotal) });
    }
    this._lastT = sample.t;
    this._latest = sample;
  }

  private _trim(): void {
    if (this._lastT === null) {
      return;
    }
    const oldest = this._lastT - this.windowS;
    const present = new Set(this._latest ? devicesOf(this._latest).map(d => d.id) : []);
    for (const [id, points] of this._points) {
      if (!present.has(id)) {
        this._points.delete(id); // a GPU that vanished (or the host once GPUs appear)
        continue;
      }
      const firstKept = points.findIndex(p => p.t >= oldest);
      if (firstKept > 0) {
        points.splice(0, firstKept);
      } else if (firstKept === -1) {
        points.length = 0;
      }
    }
  }

  private _points = new Map<string, IPoint[]>();
  private _lastT: number | null = null;
  private _latest: ISample | null = null;
}

/** Bytes as GiB/MiB with one decimal, the way nvidia-smi users read memory. */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || !Number.isFinite(bytes)) {
    return '–';
  }
  const gib = bytes / 2 ** 30;
  if (gib >= 1) {
    return `${gib.toFixed(1)} GiB`;
  }
  return `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}

/** A percentage without decimals, or an en dash when unknown. */
export function formatPercent(value: number | null): string {
  return value === null || !Number.isFinite(value) ? '–' : `${Math.round(value)}%`;
}

/**
 * The status-bar text: the busiest GPU's utilization and memory, or the host's CPU
 * and RAM without a GPU. The busiest (not the mean) because one idle GPU next to a
 * saturated one would otherwise hide the saturation.
 */
export function statusText(sample: ISample | null): string {
  if (!sample) {
    return 'Workbench: –';
  }
  if (sample.gpus.length === 0) {
    const h = sample.host;
    return `CPU ${formatPercent(h.cpu_pct)} · RAM ${formatPercent(percentOf(h.ram_used_bytes, h.ram_total_bytes))}`;
  }
  const busiest = [...sample.gpus].sort((a, b) => (b.util_pct ?? -1) - (a.util_pct ?? -1))[0];
  const label = sample.gpus.length === 1 ? 'GPU' : `GPU ${busiest.index}`;
  const mem = percentOf(busiest.mem_used_bytes, busiest.mem_total_bytes);
  return `${label} ${formatPercent(busiest.util_pct)} · mem ${formatPercent(mem)}`;
}

/**
 * The time span a chart shows: it ends at the newest point and reaches back `windowS`,
 * or only to the oldest point while the window is still filling — so a panel opened a
 * few seconds after the server started draws a line across the chart, not a sliver
 * at its right edge.
 */
export function timeAxis(points: IPoint[], windowS: number): { tMin: number; tMax: number } {
  if (points.length === 0) {
    return { tMin: 0, tMax: windowS };
  }
  const tMax = points[points.length - 1].t;
  return { tMin: Math.max(tMax - windowS, points[0].t), tMax };
}

/**
 * SVG polyline coordinates for one series inside a `width` × `height` box, with
 * time running over [tMin, tMax] left to right and 0–100 % bottom to top. A gap
 * (null value) splits the line, so one list of point strings per segment.
 */
export function polylineSegments(
  points: IPoint[],
  key: 'util' | 'mem',
  box: { width: number; height: number; tMin: number; tMax: number }
): string[] {
  const span = box.tMax - box.tMin;
  const segments: string[] = [];
  let current: string[] = [];
  for (const point of points) {
    const value = point[key];
    if (value === null || !Number.isFinite(value)) {
      if (current.length > 0) {
        segments.push(current.join(' '));
      }
      current = [];
      continue;
    }
    const x = span > 0 ? ((point.t - box.tMin) / span) * box.width : box.width;
    const y = box.height - (Math.min(100, Math.max(0, value)) / 100) * box.height;
    current.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  if (current.length > 0) {
    segments.push(current.join(' '));
  }
  return segments;
}
