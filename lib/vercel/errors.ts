// The errors the Workflow SDK expects a World to throw. The SDK tells them apart by `name` (its
// `XError.is(err)` checks the name, since each bundle of it has its own classes), so these carry
// the SDK's names and fields.

class SdkError extends Error {
  constructor(name: string, message: string) {
    super(message);
    this.name = name;
  }
}

/** A world operation failed; `status` as an HTTP world would give it. */
export class WorkflowWorldError extends SdkError {
  status?: number;
  retryAfter?: number;
  constructor(message: string, options?: { status?: number; retryAfter?: number }, name = 'WorkflowWorldError') {
    super(name, message);
    this.status = options?.status;
    this.retryAfter = options?.retryAfter;
  }
}

/** The event conflicts with the entity's state (it is terminal, or exists already). */
export class EntityConflictError extends WorkflowWorldError {
  constructor(message: string) {
    super(message, { status: 409 }, 'EntityConflictError');
  }
}

/** The run is in a terminal state: the runtime stops without retrying. */
export class RunExpiredError extends WorkflowWorldError {
  constructor(message: string) {
    super(message, { status: 410 }, 'RunExpiredError');
  }
}

/** The step may not start before its `retryAfter`; `retryAfter` in seconds. */
export class TooEarlyError extends WorkflowWorldError {
  constructor(message: string, retryAfter: number) {
    super(message, { status: 425, retryAfter }, 'TooEarlyError');
  }
}

export class WorkflowRunNotFoundError extends SdkError {
  runId: string;
  constructor(runId: string) {
    super('WorkflowRunNotFoundError', `Workflow run "${runId}" not found`);
    this.runId = runId;
  }
}

export class HookNotFoundError extends SdkError {
  token: string;
  constructor(token: string) {
    super('HookNotFoundError', 'Hook not found');
    this.token = token;
  }
}

/** The run was written by a newer spec version than this world implements. */
export class RunNotSupportedError extends SdkError {
  runSpecVersion: number;
  worldSpecVersion: number;
  constructor(runSpecVersion: number, worldSpecVersion: number) {
    super('RunNotSupportedError', `Run requires spec version ${runSpecVersion}, but world supports ${worldSpecVersion}`);
    this.runSpecVersion = runSpecVersion;
    this.worldSpecVersion = worldSpecVersion;
  }
}
