// Artifacts: content-addressed payloads stored beside the event log.
import { types } from 'node:util';
import { EventValidationError, WorldError, call, checkRunIdType, invalid, thrownName, wellFormed } from './errors.js';
import { fieldsOf, frozen, toJsonText } from './json.js';
import { nativeOf, type World } from './worlds.js';

/** How an artifact's payload is carried. */
export type ArtifactEncoding = 'json' | 'utf8' | 'bytes';

/** What describes a stored artifact. */
export type ArtifactManifest = {
  /** `art_` + the first 16 hex of sha256(JCS({runId, stepPath, name, contentType, encoding, payloadHash})). */
  readonly artifactId: string;
  /** `artifact://` + artifactId: the form events carry. */
  readonly artifactRef: string;
  readonly runId: string;
  readonly stepPath: string;
  readonly name: string;
  readonly contentType: string;
  readonly encoding: ArtifactEncoding;
  /** `sha256:` + hex of the payload bytes. */
  readonly sha256: string;
  readonly sizeBytes: number;
  readonly createdAt: string;
};

/** What to store. */
export type WriteArtifactInput = {
  runId: string;
  stepPath: string;
  name: string;
  contentType: string;
} & (
  | { encoding: 'json'; payload: unknown }
  | { encoding: 'utf8'; payload: string }
  | { encoding: 'bytes'; payload: Uint8Array }
);

/** A stored artifact, verified. */
export type ReadArtifactResult = {
  readonly manifest: ArtifactManifest;
  /**
   * The JSON value for `json`, a string for `utf8`, a Buffer for `bytes`. The Buffer is Node's,
   * the class of the global `Buffer` in any realm; in a `vm` context (Jest, Vitest's `vmThreads`)
   * no Buffer is `instanceof` the context's own `Uint8Array`, so check with `Buffer.isBuffer` or
   * `ArrayBuffer.isView` there.
   */
  readonly payload: unknown;
};

const ARTIFACT_FIELDS = ['runId', 'stepPath', 'name', 'contentType', 'encoding', 'payload'] as const;

/**
 * Store a payload as a content-addressed artifact and resolve with its manifest. Writing the same
 * artifact again verifies the stored blob and returns the stored manifest. Hashing and file I/O run
 * on the world's own threads; a `bytes` payload is copied during the call, so what is stored is
 * its bytes as they were then, whatever happens to the buffer after.
 */
export async function writeArtifact(world: World, input: WriteArtifactInput): Promise<ArtifactManifest> {
  const handle = nativeOf(world);
  const { runId, stepPath, name, contentType, encoding, payload } = fieldsOf(input, 'input', 'input.', ARTIFACT_FIELDS, 'must be an object');
  checkRunIdType(runId, 'input.runId');
  for (const [field, v] of [['stepPath', stepPath], ['name', name], ['contentType', contentType]] as const) {
    if (typeof v !== 'string') invalid(`input.${field}`, 'must be a string', runId as string);
    wellFormed(`input.${field}`, v, runId as string);
  }
  let text: string | undefined;
  let bytes: Buffer | undefined;
  if (encoding === 'json') {
    if (payload === undefined) invalid('input.payload', 'is missing', runId as string);
    text = toJsonText(payload, 'input.payload', { runId: runId as string });
  } else if (encoding === 'utf8') {
    if (typeof payload !== 'string') invalid('input.payload', "must be a string for encoding 'utf8'", runId as string);
    if (!(payload as string).isWellFormed()) invalid('input.payload', 'contains a lone surrogate, which UTF-8 cannot carry', runId as string);
    text = payload as string;
  } else if (encoding === 'bytes') {
    // isUint8Array looks at the value itself, with no getter or trap to run (a Proxy is no
    // Uint8Array), and knows one of any realm: in a test runner's `vm` context the caller's
    // Buffer is Node's, whose Uint8Array is not the context's.
    if (!types.isUint8Array(payload)) invalid('input.payload', "must be a Uint8Array for encoding 'bytes'", runId as string);
    const u8 = payload as Uint8Array;
    try {
      if (isDetached(u8)) invalid('input.payload', 'is backed by a detached ArrayBuffer (transferred away), which holds no bytes', runId as string);
      bytes = Buffer.isBuffer(u8) ? u8 : Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength);
    } catch (err) {
      if (err instanceof WorldError) throw err;
      throw new EventValidationError('EVENT_VALIDATION', `input.payload: could not be read: reading it threw ${thrownName(err)}`, { path: 'input.payload', runId }, { cause: err });
    }
  } else {
    invalid('input.encoding', "must be 'json', 'utf8' or 'bytes'", runId as string);
  }
  const json = await call(() =>
    handle.writeArtifact(runId as string, stepPath as string, name as string, contentType as string, encoding as string, text, bytes),
  );
  return frozen<ArtifactManifest>(json);
}

/** Whether `u8` views an ArrayBuffer that was transferred away (it then reads as empty). */
function isDetached(u8: Uint8Array): boolean {
  if (u8.byteLength !== 0) return false;
  try {
    new Uint8Array(u8.buffer, 0, 0);
    return false;
  } catch {
    return true;
  }
}

/**
 * Read an artifact by reference (`artifact://art_…` or `art_…`), re-hashing its bytes. Throws
 * `ArtifactNotFoundError`, `ArtifactHashMismatchError` or `ArtifactManifestCorruptError`, and
 * `RuntimeIntegrityError` when a manifest's blob is missing.
 */
export async function readArtifact(world: World, ref: string): Promise<ReadArtifactResult> {
  const handle = nativeOf(world);
  if (typeof ref !== 'string') invalid('ref', 'must be a string');
  const [manifestJson, raw] = await call(() => handle.readArtifact(ref));
  const manifest = frozen<ArtifactManifest>(manifestJson);
  // A JSON payload is deep-frozen like every other value the world returns (a string is
  // immutable already; a Buffer's bytes cannot be frozen).
  const payload = manifest.encoding === 'json' ? frozen<unknown>(raw as string) : raw;
  return Object.freeze({ manifest, payload });
}
