import {
  IGpuSample,
  ISample,
  formatBytes,
  percentOf,
  polylineSegments,
  SeriesStore,
  statusText,
  timeAxis
} from '../src/metrics';

const GiB = 2 ** 30;

function hostSample(t: number, cpu: number, ramUsed = 4 * GiB): ISample {
  return { t, gpus: [], host: { cpu_pct: cpu, ram_used_bytes: ramUsed, ram_total_bytes: 16 * GiB } };
}

function gpu(index: number, util: number | null, memUsed: number | null = 10 * GiB): IGpuSample {
  return { index, name: 'NVIDIA H200', util_pct: util, mem_used_bytes: memUsed, mem_total_bytes: 140 * GiB };
}

function gpuSample(t: number, gpus: IGpuSample[]): ISample {
  return { t, gpus, host: { cpu_pct: 5, ram_used_bytes: GiB, ram_total_bytes: 8 * GiB } };
}

describe('SeriesStore', () => {
  it('keeps each sample once when polls overlap, in time order', () => {
    const store = new SeriesStore(120);
    expect(store.add([hostSample(3, 30), hostSample(1, 10), hostSample(2, 20)])).toBe(3);
    expect(store.add([hostSample(2, 20), hostSample(3, 30), hostSample(4, 40)])).toBe(1);
    expect(store.add([hostSample(4, 99)])).toBe(0); // same timestamp again: not a new point
    const [chart] = store.charts();
    expect(chart.points.map(p => p.t)).toEqual([1, 2, 3, 4]);
    expect(chart.points.map(p => p.util)).toEqual([10, 20, 30, 40]);
    expect(store.lastT).toBe(4);
  });

  it('shows the host as CPU and RAM percent when there is no GPU', () => {
    const store = new SeriesStore();
    store.add([hostSample(1, 12.5, 4 * GiB)]);
    const charts = store.charts();
    expect(charts.map(c => c.id)).toEqual(['host']);
    expect(charts[0].utilLabel).toBe('CPU');
    expect(charts[0].points[0]).toEqual({ t: 1, util: 12.5, mem: 25 });
    expect(charts[0].current).toEqual({ util: 12.5, memUsed: 4 * GiB, memTotal: 16 * GiB });
  });

  it('draws one chart per GPU and no host chart when GPUs exist', () => {
    const store = new SeriesStore();
    store.add([gpuSample(1, [gpu(0, 50), gpu(1, 100, 70 * GiB)]), gpuSample(2, [gpu(0, 60), gpu(1, 0)])]);
    const charts = store.charts();
    expect(charts.map(c => c.id)).toEqual(['gpu0', 'gpu1']);
    expect(charts[0].title).toBe('GPU 0 · NVIDIA H200');
    expect(charts[1].points.map(p => [p.util, p.mem])).toEqual([
      [100, 50],
      [0, (100 * 10) / 140]
    ]);
  });

  it('drops points older than the window before the newest sample', () => {
    const store = new SeriesStore(10);
    store.add([0, 5, 9, 10, 15, 20].map(t => hostSample(t, t)));
    expect(store.charts()[0].points.map(p => p.t)).toEqual([10, 15, 20]);
    store.add([hostSample(100, 1)]);
    expect(store.charts()[0].points.map(p => p.t)).toEqual([100]);
  });

  it('forgets a GPU that disappears from the samples', () => {
    const store = new SeriesStore();
    store.add([gpuSample(1, [gpu(0, 1), gpu(1, 2)])]);
    store.add([gpuSample(2, [gpu(0, 3)])]);
    expect(store.charts().map(c => c.id)).toEqual(['gpu0']);
  });

  it('keeps unknown readings as gaps, not zeros', () => {
    const store = new SeriesStore();
    store.add([gpuSample(1, [gpu(0, null, null)])]);
    expect(store.charts()[0].points[0]).toEqual({ t: 1, util: null, mem: null });
  });

  it('ignores samples with a non-finite time', () => {
    const store = new SeriesStore();
    expect(store.add([hostSample(NaN, 1), hostSample(1, 2)])).toBe(1);
    expect(store.charts()[0].points).toHaveLength(1);
  });

  it('has no charts before the first sample', () => {
    expect(new SeriesStore().charts()).toEqual([]);
  });
});

describe('percentOf', () => {
  it('is null when either side is unknown or the total is zero', () => {
    expect(percentOf(null, 10)).toBeNull();
    expect(percentOf(5, null)).toBeNull();
    expect(percentOf(5, 0)).toBeNull();
    expect(percentOf(5, 10)).toBe(50);
    expect(percentOf(20, 10)).toBe(100);
  });
});

describe('statusText', () => {
  it('shows the busiest GPU, naming it when there are several', () => {
    const sample = gpuSample(1, [gpu(0, 10), gpu(1, 93, 70 * GiB), gpu(2, null)]);
    expect(statusText(sample)).toBe('GPU 1 93% · mem 50%');
  });

  it('shows the single GPU without an index', () => {
    expect(statusText(gpuSample(1, [gpu(0, 42.4, 14 * GiB)]))).toBe('GPU 42% · mem 10%');
  });

  it('falls back to CPU and RAM without a GPU, and a dash before data', () => {
    expect(statusText(hostSample(1, 7.6, 8 * GiB))).toBe('CPU 8% · RAM 50%');
    expect(statusText(null)).toBe('Workbench: –');
  });
});

describe('polylineSegments', () => {
  const box = { width: 100, height: 50, tMin: 0, tMax: 10 };

  it('maps time left to right and percent bottom to top', () => {
    const points = [
      { t: 0, util: 0, mem: null },
      { t: 5, util: 50, mem: null },
      { t: 10, util: 100, mem: null }
    ];
    expect(polylineSegments(points, 'util', box)).toEqual(['0.0,50.0 50.0,25.0 100.0,0.0']);
  });

  it('splits the line at unknown values and clamps out-of-range ones', () => {
    const points = [
      { t: 0, util: 10, mem: 0 },
      { t: 2, util: null, mem: 0 },
      { t: 4, util: 150, mem: 0 },
      { t: 6, util: -5, mem: 0 }
    ];
    expect(polylineSegments(points, 'util', box)).toEqual(['0.0,45.0', '40.0,0.0 60.0,50.0']);
    expect(polylineSegments(points, 'mem', box)).toHaveLength(1);
  });
});

describe('formatBytes', () => {
  it('uses GiB from one GiB up and MiB below, dash when unknown', () => {
    expect(formatBytes(80 * GiB)).toBe('80.0 GiB');
    expect(formatBytes(512 * 2 ** 20)).toBe('512 MiB');
    expect(formatBytes(null)).toBe('–');
  });
});

describe('timeAxis', () => {
  const at = (t: number) => ({ t, util: 1, mem: 1 });

  it('spans only the points while the window is filling', () => {
    expect(timeAxis([at(100), at(103)], 120)).toEqual({ tMin: 100, tMax: 103 });
  });

  it('spans the window once it is full', () => {
    expect(timeAxis([at(0), at(50), at(200)], 120)).toEqual({ tMin: 80, tMax: 200 });
  });

  it('has a sane default before any point', () => {
    expect(timeAxis([], 120)).toEqual({ tMin: 0, tMax: 120 });
  });
});
