// Which line of the Workflow SDK the app has installed, and what that line asks of a World: the
// spec version to declare and to stamp on new runs (the line's own constants, never a literal),
// the runs it can read, where its streams are, and how it names events.
import { sdkWorld } from './sdk.cjs';

/** What one line of `@workflow/world` asks of a World. */
export type SdkLine = {
  /** The app's `@workflow/world` version. */
  version: string | undefined;
  /** The spec version stamped on a run created now (and declared by the World). */
  minted(): number;
  /** The highest spec version of a run this line reads. */
  maxReadable: number;
  /**
   * Whether streams are methods of the World itself, a stream known by its name alone
   * (`writeToStream(name, runId, chunk)`, `readFromStream(name)`): the 4.x line. Later lines
   * have `world.streams`, a stream known by its run and its name.
   */
  worldLevelStreams: boolean;
  /**
   * The spec version from which a run's event ids are slots (`evnt_` + its position, dense from
   * 1), and the line's helper that formats one; undefined on lines without slot ids.
   */
  slots?: { fromSpecVersion: number; eventId: (slot: number) => string };
  /** The line's check of run attribute changes; undefined on lines without attributes. */
  validateAttributeChanges?: (changes: unknown[], options: { allowReservedAttributes: boolean; existingKeys?: string[] }) => void;
};

type Sdk = Record<string, unknown>;

function num(sdk: Sdk, name: string): number | undefined {
  const v = sdk[name];
  return typeof v === 'number' ? v : undefined;
}

/** The line of the `@workflow/world` module `sdk`, at `version`. */
export function lineOf(sdk: Sdk, version: string | undefined): SdkLine {
  const current = num(sdk, 'SPEC_VERSION_CURRENT');
  if (current === undefined) throw new Error(`@workflow/world ${version ?? ''} exports no SPEC_VERSION_CURRENT: not a line this World serves`);
  const minted = typeof sdk.mintedSpecVersion === 'function' ? (sdk.mintedSpecVersion as () => number) : () => current;
  const slotFrom = num(sdk, 'SPEC_VERSION_SUPPORTS_SLOT_IDENTITY');
  const slotToEventId = sdk.slotToEventId;
  const major = Number(/^(\d+)\./.exec(version ?? '')?.[1]);
  return {
    version,
    minted,
    maxReadable: num(sdk, 'SPEC_VERSION_MAX_SUPPORTED') ?? current,
    worldLevelStreams: major < 5,
    slots: slotFrom !== undefined && typeof slotToEventId === 'function' ? { fromSpecVersion: slotFrom, eventId: slotToEventId as (slot: number) => string } : undefined,
    validateAttributeChanges: typeof sdk.validateAttributeChanges === 'function' ? (sdk.validateAttributeChanges as SdkLine['validateAttributeChanges']) : undefined,
  };
}

let line: SdkLine | undefined;

/** The line of the app's `@workflow/world`, found once per process. */
export function installedLine(): SdkLine {
  if (line === undefined) {
    const { module, version } = sdkWorld();
    line = lineOf(module, version);
  }
  return line;
}
