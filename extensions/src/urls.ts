/**
 * URLs of the workbench API, relative to the server's base URL. Pure (no JupyterLab
 * import) so the path-prefix rule — the one nvdashboard got wrong — is unit-tested.
 */

/** `{baseUrl}workbench/api/{endpoint}?{query}`, for any base URL ('/', '/user/someone/', a full origin). */
export function apiUrl(baseUrl: string, endpoint: string, query: Record<string, string | number> = {}): string {
  const base = baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`;
  const path = endpoint.replace(/^\/+/, '');
  const params = Object.entries(query)
    .map(([key, value]) => `${encodeURIComponent(key)}=${encodeURIComponent(String(value))}`)
    .join('&');
  return `${base}workbench/api/${path}${params ? `?${params}` : ''}`;
}
