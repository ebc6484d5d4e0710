import { formatBytes, IWatchedJob, jobLine, jobTitle, launchLine, profileLine } from '../src/watched';

function job(overrides: Partial<IWatchedJob> = {}): IWatchedJob {
  return {
    run_id: 7,
    name: 'bev-r50',
    status: 'running',
    message: '',
    rank: null,
    world_size: null,
    job: null,
    host: 'h',
    started_at: 1,
    heartbeat_at: 2,
    last_step: 120,
    steady_median_ms: 98.25,
    step: { step: 120, wall_time: 3, step_ms: 101.5, data_ms: 50.25, peak_memory_bytes: 3 * 1024 ** 3, loss: 0.123456 },
    profile: null,
    ...overrides
  };
}

describe('watched jobs', () => {
  it('names the rank of a torchrun job and only then', () => {
    expect(jobTitle(job())).toBe('bev-r50');
    expect(jobTitle(job({ rank: 1, world_size: 8 }))).toBe('bev-r50 · rank 1/8');
  });

  it('shows the step time with its data wait, the median, memory and loss', () => {
    expect(jobLine(job())).toBe(
      'running · step 120 · 102 ms/step (data 50.3 ms) · median 98.3 ms · peak 3.0 GiB · loss 0.1235'
    );
  });

  it('leaves out what the job did not report and says why a run ended', () => {
    const bare = job({ status: 'killed', message: 'last step 3', steady_median_ms: null, step: null, last_step: 3 });
    expect(jobLine(bare)).toBe('killed · step 3 · last step 3');
    expect(formatBytes(512)).toBe('512 B');
  });

  it('says a profiled window is under way, then its finding and the first fix', () => {
    const window = { id: 1, first_step: null, last_step: null, message: '', finding: null, summary: null, fix: null };
    expect(profileLine(job())).toBe('');
    expect(profileLine(job({ profile: { ...window, status: 'requested' } }))).toBe('profiling the next steps…');
    const done = {
      ...window,
      status: 'done',
      first_step: 14,
      last_step: 18,
      finding: 'Data loading bound',
      fix: 'Load batches in 2 worker process(es)'
    };
    expect(profileLine(job({ profile: done }))).toBe(
      'steps 14–18: Data loading bound — try: Load batches in 2 worker process(es)'
    );
    expect(profileLine(job({ profile: { ...done, finding: null } }))).toBe('steps 14–18: no bottleneck found');
    expect(profileLine(job({ profile: { ...window, status: 'failed', message: 'no timed step' } }))).toBe(
      'profile failed (no timed step)'
    );
  });
});

describe('a torchrun launch', () => {
  const launch = { status: 'running', first_failed_rank: null, straggler: 1, pace: 'straggler: rank 1 (data loading) — rank 1 arrives 30.2 ms late' };

  it('shows the straggler line of the launch, and nothing for a single process', () => {
    expect(launchLine(job())).toBe('');
    expect(launchLine(job({ rank: 0, world_size: 2, job: 'j@1', launch }))).toBe(launch.pace);
  });

  it('puts the rank that failed first before it', () => {
    const failed = { ...launch, status: 'failed', first_failed_rank: 1, straggler: null, pace: 'straggler: none' };
    expect(launchLine(job({ rank: 0, world_size: 2, job: 'j@1', launch: failed }))).toBe(
      'failed: rank 1 first · straggler: none'
    );
  });
});
