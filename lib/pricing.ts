// Pricing registries: the bundled one, and the JSON text of one given to a world.
import { invalid } from './errors.js';
import { isPlainRecord, jsonOf, snapshotOf } from './json.js';
import { native } from './native.js';

/**
 * A pricing registry: USD per one million tokens. A registry given to a world is merged over the
 * bundled one model by model: a model it prices takes none of the bundled entries for it.
 */
export type PricingRegistry = {
  asOf?: string;
  models: Array<{
    provider: string;
    modelId: string;
    inputPerMTok: number;
    outputPerMTok: number;
    cacheReadPerMTok?: number;
    /**
     * From when this entry applies: an ISO-8601 instant with an offset, or a date (its midnight
     * UTC); without it, from the beginning. A model may have several entries; a call is priced by
     * the latest one in effect at its `recordedAt` (none in effect yet: unpriced, `null`).
     */
    effectiveFrom?: string;
    /** The provider's public price page (the bundled registry names one for every entry). */
    source?: string;
    note?: string;
  }>;
};

export function pricingText(pricing: PricingRegistry | undefined): string | undefined {
  if (pricing === undefined) return undefined;
  const copy = snapshotOf(pricing, 'pricing');
  if (!isPlainRecord(copy)) invalid('pricing', 'must be a pricing registry object');
  return jsonOf(copy);
}

/** The pricing registry bundled with the package (a fresh copy). */
export function bundledPricing(): PricingRegistry {
  return JSON.parse(native.bundledPricingJson()) as PricingRegistry;
}
