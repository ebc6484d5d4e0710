/**
 * "New tuning notebook": copy the packaged quickstart notebook into the current
 * folder and open it.
 *
 * The notebook comes from the server extension (`workbench/api/notebooks/quickstart`,
 * read from inside the installed package), and is written through JupyterLab's
 * Contents API — so the copy lands wherever the user's contents manager puts files
 * (local disk, S3, …) under its own rules, and the server never takes a path.
 */

import { Contents } from '@jupyterlab/services';

import { requestAPI } from './api';
import { freeName, joinPath } from './naming';

/** `GET workbench/api/notebooks/<name>`: a template's file name and its nbformat JSON. */
export interface ITemplateReply {
  name: string;
  content: Record<string, unknown>;
}

/** Save a fresh copy of the quickstart notebook in `folder`; returns its path. */
export async function copyQuickstart(contents: Contents.IManager, folder: string): Promise<string> {
  const template = await requestAPI<ITemplateReply>('notebooks/quickstart');
  const listing = await contents.get(folder, { content: true });
  const taken = Array.isArray(listing.content) ? (listing.content as Contents.IModel[]).map(item => item.name) : [];
  const path = joinPath(folder, freeName(template.name, taken));
  await contents.save(path, { type: 'notebook', format: 'json', content: template.content });
  return path;
}
