import { freeName, joinPath } from '../src/naming';
import { apiUrl } from '../src/urls';

describe('apiUrl', () => {
  it('puts the API under the base URL, so a path prefix is kept', () => {
    expect(apiUrl('/', 'metrics')).toBe('/workbench/api/metrics');
    expect(apiUrl('/user/someone/', 'metrics')).toBe('/user/someone/workbench/api/metrics');
    expect(apiUrl('/user/someone', 'metrics')).toBe('/user/someone/workbench/api/metrics');
    expect(apiUrl('http://127.0.0.1:8888/user/a%40b/', '/notebooks/quickstart')).toBe(
      'http://127.0.0.1:8888/user/a%40b/workbench/api/notebooks/quickstart'
    );
  });

  it('encodes query values', () => {
    expect(apiUrl('/', 'metrics', { since: 1733137000.25, window: 120 })).toBe(
      '/workbench/api/metrics?since=1733137000.25&window=120'
    );
    expect(apiUrl('/', 'runs', { q: 'a b&c' })).toBe('/workbench/api/runs?q=a%20b%26c');
  });
});

describe('freeName', () => {
  it('keeps the template name when the folder does not have it', () => {
    expect(freeName('01_quickstart.ipynb', ['other.ipynb'])).toBe('01_quickstart.ipynb');
  });

  it('numbers copies instead of overwriting the user’s notebook', () => {
    const taken = ['01_quickstart.ipynb', '01_quickstart-1.ipynb', '01_quickstart-3.ipynb'];
    expect(freeName('01_quickstart.ipynb', taken)).toBe('01_quickstart-2.ipynb');
  });

  it('handles names without an extension', () => {
    expect(freeName('notes', ['notes'])).toBe('notes-1');
  });
});

describe('joinPath', () => {
  it('joins Contents API paths without leading or doubled slashes', () => {
    expect(joinPath('', 'a.ipynb')).toBe('a.ipynb');
    expect(joinPath('work/runs/', 'a.ipynb')).toBe('work/runs/a.ipynb');
    expect(joinPath('/work', 'a.ipynb')).toBe('work/a.ipynb');
  });
});
