/**
 * The "Workbench" side panel: one live chart per GPU (or the host's CPU and RAM
 * when there is no GPU, with the reason), a button into a tuning notebook, and the
 * watched jobs (`wb.watch`) running or recently ended anywhere on this machine's history.
 * It only draws; polling lives in `MetricsModel` (shared with the status bar) and
 * `WatchedJobsModel` (polled only while the panel is shown).
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { DeviceChart } from './chart';
import { MetricsModel } from './model';
import { jobLine, jobTitle, launchLine, profileLine, requestProfile, WatchedJobsModel } from './watched';

export class WorkbenchPanel extends Widget {
  constructor(options: { model: MetricsModel; watched: WatchedJobsModel; onNewNotebook: () => void }) {
    super();
    this._model = options.model;
    this._watched = options.watched;
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
    const jobs = document.createElement('section');
    jobs.className = 'jp-WorkbenchPanel-watch';
    const jobsHeading = document.createElement('h3');
    jobsHeading.textContent = 'Watched jobs';
    this._jobsNote = document.createElement('p');
    this._jobsNote.className = 'jp-WorkbenchPanel-note';
    this._jobs = document.createElement('ul');
    this._jobs.className = 'jp-WorkbenchPanel-jobs';
    jobs.append(jobsHeading, this._jobsNote, this._jobs);
    this.node.append(header, this._note, this._charts, jobs);

    this._model.changed.connect(this._onChanged, this);
    this._watched.changed.connect(this._renderJobs, this);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._onChanged, this);
    this._watched.changed.disconnect(this._renderJobs, this);
    void this._watched.stop();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._render();
    this._renderJobs();
    void this._model.refresh();
    void this._watched.start();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    void this._watched.stop();
  }

  private _renderJobs(): void {
    const watched = this._watched;
    const note = watched.error ? `Cannot read watched jobs: ${watched.error}` : watched.jobs.length ? '' : watched.note;
    this._jobsNote.textContent = note;
    this._jobsNote.hidden = note === '';
    const launchesShown = new Set<string>();
    this._jobs.replaceChildren(
      ...watched.jobs.map(job => {
        const item = document.createElement('li');
        item.className = 'jp-WorkbenchPanel-job';
        item.dataset.runId = String(job.run_id);
        item.dataset.status = job.status;
        item.dataset.step = String(job.last_step);
        const title = document.createElement('strong');
        title.textContent = jobTitle(job);
        const line = document.createElement('span');
        line.textContent = jobLine(job);
        item.title = job.job ?? job.host ?? '';
        item.append(title, document.createElement('br'), line);
        const launch = launchLine(job);
        if (launch && job.job && !launchesShown.has(job.job)) {
          launchesShown.add(job.job); // once per launch, under its first rank listed
          const pace = document.createElement('div');
          pace.className = 'jp-WorkbenchPanel-launch';
          pace.textContent = launch;
          item.append(pace);
        }
        const profiled = profileLine(job);
        if (profiled) {
          const finding = document.createElement('div');
          finding.className = 'jp-WorkbenchPanel-profile';
          finding.textContent = profiled;
          item.append(finding);
        }
        if (job.status === 'running') {
          const button = document.createElement('button');
          button.className = 'jp-WorkbenchPanel-profileButton jp-mod-styled';
          button.textContent = 'Profile 5 steps';
          button.title = 'The job profiles its next 5 steps and diagnoses them; it never stops';
          button.addEventListener('click', () => {
            button.disabled = true;
            requestProfile(job.run_id).then(
              () => void this._watched.refresh(),
              reason => {
                button.disabled = false;
                this._jobsNote.textContent = `Cannot ask for a profile: ${reason instanceof Error ? reason.message : reason}`;
                this._jobsNote.hidden = false;
              }
            );
          });
          item.append(button);
        }
        return item;
      })
    );
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
  private _watched: WatchedJobsModel;
  private _jobsNote: HTMLElement;
  private _jobs: HTMLElement;
  private _note: HTMLElement;
  private _charts: HTMLElement;
  private _chartWidgets = new Map<string, DeviceChart>();
}
