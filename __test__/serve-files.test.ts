// What `little serve` serves besides runs: the inspector's files (those listed, and nothing else)
// and the event types the package knows.
import { readdirSync, readFileSync } from 'node:fs';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as lib from '@little-workflow/world';
import { virtualWorld } from '@little-workflow/world';
import { packageRoot, track } from './helpers';
import { createServer } from '../server/serve.js';

const INSPECTOR = join(packageRoot, 'inspector');

async function serving<T>(f: (base: string) => Promise<T>): Promise<T> {
  const server = createServer(lib, track(virtualWorld()));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    return await f(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
}

/** The status of a GET of `path` sent as it is (fetch would resolve `..` before sending it). */
function statusOf(base: string, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const { hostname, port } = new URL(base);
    const req = request({ hostname, port, path }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', reject);
    req.end();
  });
}

describe('little serve', () => {
  it('serves every module of the inspector as JavaScript, under its Content-Security-Policy', async () => {
    const modules = readdirSync(INSPECTOR).filter((f) => f.endsWith('.js'));
    expect(modules).toContain('app.js');
    // Each module a module imports is one of them: none is left out of the list the server serves.
    for (const m of modules) {
      for (const [, imported] of readFileSync(join(INSPECTOR, m), 'utf8').matchAll(/^import .* from '\.\/([^']+)';$/gm)) {
        expect(modules, `${m} imports ${imported}`).toContain(imported);
      }
    }
    await serving(async (base) => {
      const page = await (await fetch(`${base}/`)).text();
      expect(page).toContain('<script type="module" src="app.js"></script>');
      for (const m of modules) {
        const res = await fetch(`${base}/${m}`);
        expect(res.status, m).toBe(200);
        expect(res.headers.get('content-type'), m).toBe('text/javascript; charset=utf-8');
        expect(res.headers.get('content-security-policy'), m).toContain("script-src 'self'");
        expect(await res.text()).toBe(readFileSync(join(INSPECTOR, m), 'utf8'));
      }
    });
  });

  it('serves no file it does not list, however the path is spelled', async () => {
    await serving(async (base) => {
      for (const path of ['/README.md', '/dev-server.mjs', '/../package.json', '/%2e%2e/package.json', '/..%2fpackage.json', '/app.js/', '/./app.js/../../world.js', '/inspector/app.js']) {
        expect(await statusOf(base, path), path).toBe(404);
      }
    });
  });

  it('answers GET /api/types with the event types the package knows', async () => {
    await serving(async (base) => {
      const res = await fetch(`${base}/api/types`);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('application/json; charset=utf-8');
      expect(await res.json()).toEqual(lib.knownEventTypes());
    });
  });
});
