/**
 * @little-workflow/world: the durable storage layer of a TypeScript workflow runtime.
 *
 * This module is the thin front of a Rust core. It checks what only JavaScript can see (values
 * JSON cannot carry exactly, such as NaN, BigInt, cycles or `undefined` in an array), turns
 * payloads into JSON text on the way in and frozen objects on the way out, and maps the core's
 * error codes to the error classes it exports. Every rule about events lives in the core.
 *
 * The code is in `lib/`, a module per concern; this entry re-exports the public API.
 */
export {
  ArtifactHashMismatchError,
  ArtifactManifestCorruptError,
  ArtifactNotFoundError,
  EventAppendIdempotencyConflictError,
  EventLogCorruptError,
  EventSequenceConflictError,
  EventValidationError,
  IndexEntryConflictError,
  OuterLoopInputMismatchError,
  ReplayRefusedError,
  RunLockedError,
  RuntimeIntegrityError,
  WorldClosedError,
  WorldError,
  WorldIoError,
  WorldPathError,
} from './lib/errors.js';
export { localWorld, postgresWorld, virtualWorld, type ArtifactsOptions, type Durability, type LocalWorldOptions, type PostgresWorldOptions, type VirtualWorldOptions, type World } from './lib/worlds.js';
export { isRunId, isSessionId, knownEventTypes, type KnownEventTypes } from './lib/ids.js';
export type { EventEnvelope } from './lib/envelopes.js';
export { appendEvent, appendEvents, canonicalize, listEvents, validateEventLogShape, type AppendEventInput, type IndexWrite, type ListEventsOptions } from './lib/events.js';
export { listIndexEntries, lookupIndexEntry, type IndexEntry, type ListIndexEntriesOptions } from './lib/index-entries.js';
export {
  readArtifact,
  writeArtifact,
  type ArtifactEncoding,
  type ArtifactManifest,
  type ReadArtifactResult,
  type WriteArtifactInput,
} from './lib/artifacts.js';
export { bundledPricing, type PricingRegistry } from './lib/pricing.js';
export {
  materializeRunState,
  materializeRunStateFromEvents,
  type ManifestDrift,
  type MaterializedRunState,
  type MaterializedSession,
  type MaterializedStepState,
  type UsageTotals,
} from './lib/materialize.js';
export {
  acquireOuterLoopLock,
  acquireRunLock,
  readOuterLoopManifest,
  writeOuterLoopManifest,
  type OuterLoopManifest,
  type RunLock,
} from './lib/locks.js';
export { listRuns, queryRuns, verifyWorld, type QueryRunsOptions, type RunPage, type RunSummary, type VerifyOptions, type VerifyProblem, type VerifyReport } from './lib/inspect.js';
export { subscribe, type SubscribeOptions } from './lib/subscribe.js';
export {
  backupWorld,
  compactWorld,
  deleteRun,
  exportRuns,
  importRuns,
  moveArtifactsToBucket,
  pruneRuns,
  type DeletedRun,
  type MovedArtifacts,
  type ExportRunsOptions,
  type ImportedRuns,
  type PrunedRuns,
  type PruneRunsOptions,
} from './lib/lifecycle.js';
export {
  appendRunEvent,
  appendSessionEvent,
  foldRunEvents,
  listRunEvents,
  loadRunEventLogForReplay,
  restoreRunCosts,
  type InterfaceDraft,
  type RunCosts,
  type RunEvent,
  type RunEventDraft,
  type RunEventState,
  type SessionEvent,
  type SessionEventDraft,
} from './lib/run-events.js';
