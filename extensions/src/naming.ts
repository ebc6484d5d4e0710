/**
 * Where "New tuning notebook" puts its copy: the template's name in the current
 * folder, or the first free `name-N.ipynb` — never over a notebook the user has
 * (the same rule JupyterLab's "Duplicate" follows). Pure, so it is unit-tested.
 */

/** The first of `stem.ext`, `stem-1.ext`, `stem-2.ext`, … not in `taken`. */
export function freeName(fileName: string, taken: Iterable<string>): string {
  const names = new Set(taken);
  if (!names.has(fileName)) {
    return fileName;
  }
  const dot = fileName.lastIndexOf('.');
  const stem = dot > 0 ? fileName.slice(0, dot) : fileName;
  const ext = dot > 0 ? fileName.slice(dot) : '';
  for (let n = 1; ; n++) {
    const candidate = `${stem}-${n}${ext}`;
    if (!names.has(candidate)) {
      return candidate;
    }
  }
}

/** `folder/name` as a Contents API path ('' is the server's root folder). */
export function joinPath(folder: string, name: string): string {
  const trimmed = folder.replace(/^\/+|\/+$/g, '');
  return trimmed ? `${trimmed}/${name}` : name;
}
