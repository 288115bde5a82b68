// Imported first by the Vercel World's tests: polyfills what the SDK's suite needs on Node 20,
// here and (through NODE_OPTIONS) in every server the suite spawns.
import { createRequire } from 'node:module';
import { join } from 'node:path';

const polyfill = join(__dirname, 'vercel-polyfill.cjs');
createRequire(__filename)(polyfill);
const prior = process.env.NODE_OPTIONS ?? '';
if (!prior.includes(polyfill)) process.env.NODE_OPTIONS = `${prior} --require ${JSON.stringify(polyfill)}`.trim();
