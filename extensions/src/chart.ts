/**
 * A small SVG line chart: utilization and memory (both 0–100 %) over the last
 * minutes of one device. Hand-drawn SVG instead of a chart library keeps the
 * prebuilt extension a few kB and redraws cheap at one update per second.
 *
 * `data-points` and `data-last-t` on the chart element say what it drew, for the
 * browser test and for anyone inspecting the page.
 */

import { Widget } from '@lumino/widgets';

import { formatBytes, formatPercent, IChartData, polylineSegments, timeAxis } from './metrics';

const SVG_NS = 'http://www.w3.org/2000/svg';
const WIDTH = 300;
const HEIGHT = 90;

export class DeviceChart extends Widget {
  constructor(id: string) {
    super();
    this.addClass('jp-WorkbenchChart');
    this.node.dataset.device = id;
    this._title = document.createElement('div');
    this._title.className = 'jp-WorkbenchChart-title';
    this._legend = document.createElement('div');
    this._legend.className = 'jp-WorkbenchChart-legend';
    this._svg = document.createElementNS(SVG_NS, 'svg');
    this._svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
    this._svg.setAttribute('preserveAspectRatio', 'none');
    this._svg.setAttribute('role', 'img');
    this.node.append(this._title, this._svg, this._legend);
  }

  /** Redraw from `data`; the time axis ends at the newest point and spans `windowS`. */
  render(data: IChartData, windowS: number): void {
    this._title.textContent = data.title;
    this._svg.setAttribute('aria-label', `${data.title}: ${data.utilLabel} and ${data.memLabel} over time`);
    const box = { width: WIDTH, height: HEIGHT, ...timeAxis(data.points, windowS) };
    const points = data.points;
    const tMax = box.tMax;
    this._svg.replaceChildren(...this._grid(), ...this._lines(points, 'mem', box), ...this._lines(points, 'util', box));
    this.node.dataset.points = String(points.length);
    this.node.dataset.lastT = String(tMax);
    const { util, memUsed, memTotal } = data.current;
    const span = document.createElement('span');
    span.className = 'jp-WorkbenchChart-span';
    span.textContent = `last ${Math.round(box.tMax - box.tMin)} s`;
    this._legend.replaceChildren(
      this._legendItem('util', `${data.utilLabel} ${formatPercent(util)}`),
      this._legendItem('mem', `${data.memLabel} ${formatBytes(memUsed)} / ${formatBytes(memTotal)}`),
      span
    );
  }

  private _grid(): SVGElement[] {
    return [25, 50, 75].map(pct => {
      const line = document.createElementNS(SVG_NS, 'line');
      const y = String(HEIGHT - (pct / 100) * HEIGHT);
      line.setAttribute('x1', '0');
      line.setAttribute('x2', String(WIDTH));
      line.setAttribute('y1', y);
      line.setAttribute('y2', y);
      line.setAttribute('class', 'jp-WorkbenchChart-grid');
      return line;
    });
  }

  private _lines(
    points: IChartData['points'],
    key: 'util' | 'mem',
    box: { width: number; height: number; tMin: number; tMax: number }
  ): SVGElement[] {
    return polylineSegments(points, key, box).map(segment => {
      const line = document.createElementNS(SVG_NS, 'polyline');
      line.setAttribute('points', segment);
      line.setAttribute('class', `jp-WorkbenchChart-line jp-WorkbenchChart-${key}`);
      line.setAttribute('vector-effect', 'non-scaling-stroke');
      return line;
    });
  }

  private _legendItem(key: 'util' | 'mem', text: string): HTMLElement {
    const item = document.createElement('span');
    item.className = `jp-WorkbenchChart-key jp-WorkbenchChart-key-${key}`;
    item.textContent = text;
    return item;
  }

  private _title: HTMLElement;
  private _legend: HTMLElement;
  private _svg: SVGSVGElement;
}
