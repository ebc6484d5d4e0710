/**
 * Requests to the workbench server extension.
 *
 * Every URL is built from `ServerConnection.makeSettings().baseUrl`, which JupyterLab
 * fills from the page's `baseUrl` — so the extension keeps working under a path
 * prefix such as JupyterHub's `/user/<name>/` (hard-coded `/workbench/...` paths are
 * what broke nvdashboard there). The same settings carry the XSRF token and auth.
 */

import { ServerConnection } from '@jupyterlab/services';

import { apiUrl } from './urls';

/** GET (or, with `init`, POST) a JSON endpoint; a non-2xx answer raises `ServerConnection.ResponseError` with the server's message. */
export async function requestAPI<T>(
  endpoint: string,
  query: Record<string, string | number> = {},
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const response = await ServerConnection.makeRequest(apiUrl(settings.baseUrl, endpoint, query), init, settings);
  const text = await response.text();
  let data: unknown = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const message = typeof data === 'object' && data !== null && 'message' in data ? String(data.message) : text;
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}
