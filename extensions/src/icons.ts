/** The workbench icon: a gauge, drawn in JupyterLab's themeable icon colour. */

import { LabIcon } from '@jupyterlab/ui-components';

const GAUGE_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16">
  <path class="jp-icon3" fill="#616161" d="M12 4a10 10 0 0 0-10 10c0 2 .6 3.9 1.6 5.4l1.7-1A8 8 0 0 1 4 14a8 8 0 0 1 16 0c0 1.6-.5 3.1-1.3 4.4l1.7 1A10 10 0 0 0 22 14 10 10 0 0 0 12 4zm4.6 4.3-5.3 4.3a1.8 1.8 0 1 0 2.3 2.3l4.3-5.3-1.3-1.3z"/>
</svg>`;

export const workbenchIcon = new LabIcon({ name: 'training-workbench:gauge', svgstr: GAUGE_SVG });
