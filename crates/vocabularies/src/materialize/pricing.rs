//! Prices, and money that adds up exactly.
//!
//! Rates are USD per one million tokens. Each rate is held as an integer count of nano-dollars
//! per million tokens, so one token at that rate costs exactly that many femto-dollars (1e-15
//! USD). Costs are summed as integers and turned into a decimal `number` once, at the end: a
//! million calls cost exactly a million times one call, with no floating-point drift.
//!
//! The bundled registry (`pricing.json`, with `asOf` and a source page per entry) is the base; a
//! registry passed by the caller is merged over it, model by model (a model the caller prices
//! takes none of the bundled entries for it).
//!
//! A model may have several entries, each with an `effectiveFrom` instant (or a date, meaning its
//! midnight UTC) from which it applies; an entry without one applies from the beginning. A call
//! is priced by the entry in effect when it was recorded (its envelope's `recordedAt`), so an
//! announced price change is bundled before the day it takes effect, and replaying an old run
//! gives the cost it had.

use crate::iso::{parse_instant, Instant};
use little_world_kernel::canonical;
use little_world_kernel::error::{Result, WorldError};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The registry bundled with the package.
pub const BUNDLED_JSON: &str = include_str!("pricing.json");

/// An amount of money in femto-dollars (1e-15 USD).
pub type Femto = u128;

/// Rates of one model, in nano-dollars per million tokens (= femto-dollars per token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rates {
    pub input: u64,
    pub output: u64,
    pub cache_read: Option<u64>,
}

impl Rates {
    /// The cost of one call: uncached input at the input rate, cached input at the cache-read rate
    /// where there is one (else the input rate), output (reasoning included) at the output rate.
    pub fn cost(&self, input: u64, cached: u64, output: u64) -> Femto {
        let cached = cached.min(input);
        (input - cached) as Femto * self.input as Femto
            + cached as Femto * self.cache_read.unwrap_or(self.input) as Femto
            + output as Femto * self.output as Femto
    }
}

/// A pricing registry: rates by (provider, model id), each model's entries in `effectiveFrom`
/// order (an entry in effect from the beginning first).
#[derive(Debug, Clone, Default)]
pub struct Pricing {
    pub as_of: Option<String>,
    rates: HashMap<(String, String), Dated>,
}

/// A model's entries: each with the instant it takes effect (`None`: from the beginning).
type Dated = Vec<(Option<Instant>, Rates)>;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RegistryJson {
    as_of: Option<String>,
    models: Vec<ModelJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModelJson {
    provider: String,
    model_id: String,
    input_per_m_tok: f64,
    output_per_m_tok: f64,
    cache_read_per_m_tok: Option<f64>,
    effective_from: Option<String>,
}

/// An `effectiveFrom`: an ISO-8601 instant with an offset, or a date (its midnight UTC).
fn effective_from(text: &str) -> Option<Instant> {
    if text.len() == 10 {
        parse_instant(&format!("{text}T00:00:00Z"))
    } else {
        parse_instant(text)
    }
}

fn key(provider: &str, model_id: &str) -> (String, String) {
    (provider.to_ascii_lowercase(), model_id.to_string())
}

impl Pricing {
    /// The bundled registry, parsed once.
    pub fn bundled() -> &'static Pricing {
        static BUNDLED: OnceLock<Pricing> = OnceLock::new();
        BUNDLED.get_or_init(|| Pricing::parse(BUNDLED_JSON).expect("the bundled pricing registry is valid"))
    }

    /// Parse a registry's JSON text, checking every rate.
    pub fn parse(text: &str) -> Result<Pricing> {
        let reg: RegistryJson = serde_json::from_str(text)
            .map_err(|e| WorldError::validation("pricing", format!("is not a pricing registry: {e}")))?;
        let mut rates: HashMap<(String, String), Dated> = HashMap::with_capacity(reg.models.len());
        for (i, m) in reg.models.iter().enumerate() {
            let at = |field: &str| format!("pricing.models[{i}].{field}");
            if m.provider.is_empty() || m.model_id.is_empty() {
                return Err(WorldError::validation(
                    at("modelId"),
                    "provider and modelId must be non-empty strings",
                ));
            }
            let r = Rates {
                input: nano_per_mtok(m.input_per_m_tok).map_err(|e| WorldError::validation(at("inputPerMTok"), e))?,
                output: nano_per_mtok(m.output_per_m_tok)
                    .map_err(|e| WorldError::validation(at("outputPerMTok"), e))?,
                cache_read: m
                    .cache_read_per_m_tok
                    .map(nano_per_mtok)
                    .transpose()
                    .map_err(|e| WorldError::validation(at("cacheReadPerMTok"), e))?,
            };
            let from = match &m.effective_from {
                None => None,
                Some(text) => Some(effective_from(text).ok_or_else(|| {
                    WorldError::validation(
                        at("effectiveFrom"),
                        "must be a date (YYYY-MM-DD) or an ISO-8601 instant with an offset",
                    )
                })?),
            };
            let entries = rates.entry(key(&m.provider, &m.model_id)).or_default();
            if entries.iter().any(|(f, _)| *f == from) {
                return Err(WorldError::validation(
                    at("effectiveFrom"),
                    format!(
                        "{}/{} has two entries in effect from the same {}",
                        m.provider,
                        m.model_id,
                        if from.is_some() { "instant" } else { "beginning" }
                    ),
                ));
            }
            entries.push((from, r));
            // `None` (from the beginning) sorts first.
            entries.sort_by_key(|(f, _)| *f);
        }
        Ok(Pricing {
            as_of: reg.as_of,
            rates,
        })
    }

    /// This registry with `over`'s entries (and `asOf`, when it has one) taking precedence.
    pub fn merged(&self, over: &Pricing) -> Pricing {
        let mut out = self.clone();
        out.rates.extend(over.rates.iter().map(|(k, v)| (k.clone(), v.clone())));
        if over.as_of.is_some() {
            out.as_of.clone_from(&over.as_of);
        }
        out
    }

    /// The bundled registry with the registry text `over` merged over it, if there is one.
    pub fn with_override(over: Option<&str>) -> Result<Pricing> {
        match over {
            Some(text) => Ok(Pricing::bundled().merged(&Pricing::parse(text)?)),
            None => Ok(Pricing::bundled().clone()),
        }
    }

    /// Rates of a model for a call recorded at `recorded_at` (an ISO-8601 instant), if the
    /// registry prices it then: the latest entry in effect at that instant. A call recorded before
    /// every entry of its model is unpriced; one whose time cannot be read takes the latest entry.
    /// Providers match case-insensitively.
    pub fn rates_at(&self, provider: &str, model_id: &str, recorded_at: &str) -> Option<Rates> {
        let entries = self.rates.get(&(provider.to_ascii_lowercase(), model_id.to_string()))?;
        // Most models have one entry, in effect from the beginning: no time to read.
        if let [(None, r)] = entries.as_slice() {
            return Some(*r);
        }
        match parse_instant(recorded_at) {
            Some(at) => entries
                .iter()
                .rev()
                .find(|(from, _)| from.is_none_or(|f| f <= at))
                .map(|(_, r)| *r),
            None => entries.last().map(|(_, r)| *r),
        }
    }

    /// A text that two registries share exactly when they price every call alike: each model's
    /// entries in order, and `asOf` (which a state names).
    pub fn fingerprint(&self) -> String {
        let mut models: Vec<_> = self.rates.iter().collect();
        models.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = format!("asOf {:?}\n", self.as_of);
        for ((provider, model), entries) in models {
            out.push_str(&format!("{provider:?} {model:?}"));
            for (from, r) in entries {
                let from = from.map_or("-".to_string(), |(s, n)| format!("{s}.{n}"));
                let cache = r.cache_read.map_or("-".to_string(), |c| c.to_string());
                out.push_str(&format!(" [{from} {} {} {cache}]", r.input, r.output));
            }
            out.push('\n');
        }
        out
    }

    /// Rates of a model as they stand now (its latest entry), if the registry prices it.
    pub fn rates(&self, provider: &str, model_id: &str) -> Option<Rates> {
        self.rates
            .get(&(provider.to_ascii_lowercase(), model_id.to_string()))
            .and_then(|entries| entries.last())
            .map(|(_, r)| *r)
    }
}

/// A USD-per-million-tokens rate as whole nano-dollars, refusing what cannot be held exactly.
fn nano_per_mtok(usd: f64) -> std::result::Result<u64, String> {
    if !usd.is_finite() || usd < 0.0 {
        return Err("must be a non-negative number".into());
    }
    // The shortest decimal that reads back as this double: the number the author wrote.
    let mut text = Vec::new();
    canonical::write_f64(usd, &mut text);
    let text = String::from_utf8(text).expect("ASCII");
    let (mantissa, exp) = match text.split_once('e') {
        Some((m, e)) => (
            m.to_string(),
            e.parse::<i32>().map_err(|_| "unreadable number".to_string())?,
        ),
        None => (text.clone(), 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((&mantissa, ""));
    let digits = format!("{int}{frac}");
    let scale = frac.len() as i32 - exp; // value = digits * 10^-scale
    let shift = 9 - scale; // nano = digits * 10^shift
    if shift < 0 {
        return Err("has more than 9 decimal places of a dollar per million tokens".into());
    }
    let digits: u128 = digits.parse().map_err(|_| "unreadable number".to_string())?;
    let nano = 10u128
        .checked_pow(shift as u32)
        .and_then(|p| digits.checked_mul(p))
        .filter(|n| *n <= u64::MAX as u128)
        .ok_or_else(|| "is too large".to_string())?;
    Ok(nano as u64)
}

/// Femto-dollars as the nearest `number` of dollars (one rounding, at the end).
pub fn femto_to_usd(f: Femto) -> f64 {
    let whole = f / 1_000_000_000_000_000;
    let frac = f % 1_000_000_000_000_000;
    format!("{whole}.{frac:015}").parse().expect("a decimal parses")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_exact_decimals() {
        assert_eq!(nano_per_mtok(1.25), Ok(1_250_000_000));
        assert_eq!(nano_per_mtok(0.075), Ok(75_000_000));
        assert_eq!(nano_per_mtok(0.0000001), Ok(100));
        // Past 10^38 the power itself overflows u128; it must be refused, not wrap to $0.
        for huge in [1e11, 1e38, 1e39, 1e119, 1e300, f64::MAX] {
            assert_eq!(nano_per_mtok(huge), Err("is too large".to_string()), "{huge}");
        }
        assert_eq!(nano_per_mtok(15.0), Ok(15_000_000_000));
        assert!(nano_per_mtok(0.0000000001).is_err());
        assert!(nano_per_mtok(-1.0).is_err());
    }

    #[test]
    fn a_million_calls_cost_exactly_a_million_times_one() {
        let r = Rates {
            input: nano_per_mtok(1.25).unwrap(),
            output: nano_per_mtok(10.0).unwrap(),
            cache_read: Some(nano_per_mtok(0.125).unwrap()),
        };
        let one = r.cost(1234, 200, 567);
        let total: Femto = (0..1_000_000).map(|_| r.cost(1234, 200, 567)).sum();
        assert_eq!(total, one * 1_000_000);
        // 1034 * 1.25 + 200 * 0.125 + 567 * 10 = 6987.5 dollars per million calls.
        assert_eq!(femto_to_usd(total), 6987.5);
        assert_eq!(femto_to_usd(one), 0.0069875);
    }

    #[test]
    fn the_bundled_registry_parses_and_names_its_date() {
        let p = Pricing::bundled();
        assert!(p.as_of.is_some());
        assert!(p.rates.len() >= 20);
        for provider in ["openai", "anthropic", "google", "deepseek"] {
            assert!(p.rates.keys().any(|(pv, _)| pv == provider), "{provider}");
        }
        let v: serde_json::Value = serde_json::from_str(BUNDLED_JSON).unwrap();
        for m in v["models"].as_array().unwrap() {
            assert!(m["source"].as_str().unwrap().starts_with("https://"), "{m}");
        }
    }

    #[test]
    fn overrides_merge_over_the_bundled_registry() {
        let over = Pricing::parse(r#"{"models":[{"provider":"OpenAI","modelId":"gpt-5","inputPerMTok":2,"outputPerMTok":3},{"provider":"acme","modelId":"m1","inputPerMTok":1,"outputPerMTok":1}]}"#).unwrap();
        let merged = Pricing::bundled().merged(&over);
        assert_eq!(merged.rates("openai", "gpt-5").unwrap().input, 2_000_000_000);
        assert!(merged.rates("acme", "m1").is_some());
        assert!(merged.rates("anthropic", "claude-opus-4-5").is_some());
        assert_eq!(merged.as_of, Pricing::bundled().as_of);
        let err = Pricing::parse(r#"{"models":[{"provider":"a","modelId":"b","inputPerMTok":-1,"outputPerMTok":1}]}"#)
            .unwrap_err();
        assert_eq!(err.details()["path"], "pricing.models[0].inputPerMTok");
    }

    #[test]
    fn a_call_is_priced_by_the_entry_in_effect_when_it_was_recorded() {
        let p = Pricing::parse(
            r#"{"models":[
                {"provider":"acme","modelId":"m","inputPerMTok":4,"outputPerMTok":20,"effectiveFrom":"2026-12-01"},
                {"provider":"acme","modelId":"m","inputPerMTok":2,"outputPerMTok":10},
                {"provider":"acme","modelId":"m","inputPerMTok":8,"outputPerMTok":40,"effectiveFrom":"2027-01-01T12:00:00+02:00"},
                {"provider":"acme","modelId":"later","inputPerMTok":1,"outputPerMTok":1,"effectiveFrom":"2026-06-01"}
            ]}"#,
        )
        .unwrap();
        let input = |at: &str| p.rates_at("acme", "m", at).map(|r| r.input / 1_000_000_000);
        assert_eq!(input("2026-11-30T23:59:59.999Z"), Some(2));
        assert_eq!(input("2026-12-01T00:00:00.000Z"), Some(4));
        assert_eq!(input("2027-01-01T09:59:59.999Z"), Some(4));
        assert_eq!(
            input("2027-01-01T10:00:00.000Z"),
            Some(8),
            "12:00 at +02:00 is 10:00 UTC"
        );
        assert_eq!(input("not a time"), Some(8), "the latest entry");
        assert_eq!(p.rates("acme", "m").unwrap().input, 8_000_000_000);
        // Before its first entry, a model is not priced: null, never a guess.
        assert!(p.rates_at("acme", "later", "2026-05-31T00:00:00.000Z").is_none());
        assert!(p.rates_at("acme", "later", "2026-06-01T00:00:00.000Z").is_some());
        // The bundled Gemini 4 Carbon doubles on 2026-12-01.
        let carbon = |at: &str| {
            Pricing::bundled()
                .rates_at("google", "gemini-4-carbon", at)
                .unwrap()
                .output
        };
        assert_eq!(
            carbon("2026-11-30T12:00:00.000Z") * 2,
            carbon("2026-12-01T00:00:00.000Z")
        );
        for (bad, what) in [
            (r#""effectiveFrom":"next week""#, "effectiveFrom"),
            (r#""effectiveFrom":"2026-02-30""#, "effectiveFrom"),
        ] {
            let text =
                format!(r#"{{"models":[{{"provider":"a","modelId":"b","inputPerMTok":1,"outputPerMTok":1,{bad}}}]}}"#);
            let err = Pricing::parse(&text).unwrap_err();
            assert_eq!(err.details()["path"], format!("pricing.models[0].{what}"), "{bad}");
        }
        let twice = r#"{"models":[{"provider":"a","modelId":"b","inputPerMTok":1,"outputPerMTok":1},{"provider":"a","modelId":"b","inputPerMTok":2,"outputPerMTok":2}]}"#;
        assert!(Pricing::parse(twice).unwrap_err().to_string().contains("two entries"));
    }
}
