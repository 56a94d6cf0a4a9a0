//! Resource amounts: Kubernetes quantities as integers of milli-units, and lists of them.
//!
//! Every amount is an `i64` of thousandths of its unit, as kube-scheduler counts CPU
//! (`MilliValue`), for every resource alike: `cpu: 500m` is 500, `memory: 1Gi` is
//! 1,073,741,824,000, `nvidia.com/gpu: 8` is 8,000, one Pod is 1,000. Sums and comparisons are
//! then exact integer arithmetic. A quantity is rounded up to the next milli-unit (a request of
//! `0.5m` CPU counts as 1m, as the API server rounds it).
//!
//! The quantity grammar is Kubernetes' (`k8s.io/apimachinery/pkg/api/resource`):
//! `[+-]digits[.digits](Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|e<exp>|E<exp>)?`. It is parsed here
//! rather than with `kube_quantity`, whose integer conversions drop the fraction before scaling
//! (`1.5Gi` became 1 GiB) and refuse milli-units outright.

use std::collections::BTreeMap;
use std::fmt;

/// Thousandths of a unit of some resource.
pub type Amount = i64;

/// One unit of anything, in milli-units.
pub const ONE: Amount = 1000;

/// The name of the Pod count in a resource list (Kubernetes' `pods`).
pub const PODS: &str = "pods";

/// Why a quantity is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not Kubernetes' quantity grammar.
    #[error("{0:?} is not a quantity (e.g. 500m, 2, 1.5Gi, 8)")]
    Syntax(String),
    /// Negative: no request or capacity is.
    #[error("{0:?} is negative")]
    Negative(String),
    /// Beyond what an i64 of milli-units holds (about 9.2e15 units).
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// `q` in milli-units, rounded up.
///
/// # Errors
/// [`QuantityError`] when `q` is not a non-negative quantity that fits.
pub fn parse(q: &str) -> Result<Amount, QuantityError> {
    let syntax = || QuantityError::Syntax(q.to_string());
    let s = q.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let end = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(syntax());
    }
    // (binary multiplier, decimal exponent) of the suffix, milli-units included (+3).
    let (binary, exp): (u32, i32) = match suffix {
        "Ki" => (1, 3),
        "Mi" => (2, 3),
        "Gi" => (3, 3),
        "Ti" => (4, 3),
        "Pi" => (5, 3),
        "Ei" => (6, 3),
        "m" => (0, 0),
        "" => (0, 3),
        "k" => (0, 6),
        "M" => (0, 9),
        "G" => (0, 12),
        "T" => (0, 15),
        "P" => (0, 18),
        "E" => (0, 21),
        e if e.starts_with(['e', 'E']) => {
            let n: i32 = e[1..].parse().map_err(|_| syntax())?;
            if !(-30..=30).contains(&n) {
                return Err(QuantityError::TooLarge(q.to_string()));
            }
            (0, n + 3)
        }
        _ => return Err(syntax()),
    };
    let too_large = || QuantityError::TooLarge(q.to_string());
    let digits: i128 = format!("{int}{frac}")
        .trim_start_matches('0')
        .parse::<i128>()
        .or_else(|e| {
            if format!("{int}{frac}").chars().all(|c| c == '0') {
                Ok(0)
            } else if *e.kind() == std::num::IntErrorKind::PosOverflow {
                Err(too_large())
            } else {
                Err(syntax())
            }
        })?;
    if negative && digits != 0 {
        return Err(QuantityError::Negative(q.to_string()));
    }
    // value = digits * 1024^binary * 10^(exp - frac.len()), rounded up.
    let pow10 = |n: u32| 10i128.checked_pow(n).ok_or_else(too_large);
    let mut numerator = digits
        .checked_mul(1024i128.pow(binary))
        .ok_or_else(too_large)?;
    let shift = exp - frac.len() as i32;
    let milli = if shift >= 0 {
        numerator = numerator
            .checked_mul(pow10(shift as u32)?)
            .ok_or_else(too_large)?;
        numerator
    } else {
        let d = pow10((-shift) as u32)?;
        numerator / d + i128::from(numerator % d != 0)
    };
    Amount::try_from(milli).map_err(|_| too_large())
}

/// `milli` of `resource` as a person reads it: CPU in cores (`1.5`, `250m`), memory and storage
/// in binary units (`4Gi`, `512Mi`, or bytes), anything else as a count (`8`, `0.5`).
pub fn show(resource: &str, milli: Amount) -> String {
    let bytes =
        resource == "memory" || resource.contains("storage") || resource.starts_with("hugepages-");
    if bytes {
        let b = milli / ONE + i64::from(milli % ONE != 0);
        for (unit, size) in [
            ("Ti", 1i64 << 40),
            ("Gi", 1 << 30),
            ("Mi", 1 << 20),
            ("Ki", 1 << 10),
        ] {
            if b >= size && b % size == 0 {
                return format!("{}{unit}", b / size);
            }
        }
        for (unit, size) in [("Ti", 1i64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)] {
            if b >= size {
                return format!("{:.1}{unit}", b as f64 / size as f64);
            }
        }
        return b.to_string();
    }
    if milli % ONE == 0 {
        (milli / ONE).to_string()
    } else if resource == "cpu" && milli < ONE {
        format!("{milli}m")
    } else {
        let s = format!("{:.3}", milli as f64 / ONE as f64);
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A list of resources and their amounts (milli-units), by name; a resource absent is zero.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Resources(pub BTreeMap<String, Amount>);

impl Resources {
    /// No resources.
    pub fn new() -> Resources {
        Resources::default()
    }

    /// The amount of `name` (0 when absent).
    pub fn get(&self, name: &str) -> Amount {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// Sets `name` to `amount` (0 removes it).
    pub fn set(&mut self, name: &str, amount: Amount) {
        if amount == 0 {
            self.0.remove(name);
        } else {
            self.0.insert(name.to_string(), amount);
        }
    }

    /// Adds `other`, resource by resource (saturating).
    pub fn add(&mut self, other: &Resources) {
        for (name, a) in &other.0 {
            let v = self.get(name).saturating_add(*a);
            self.set(name, v);
        }
    }

    /// Subtracts `other`, resource by resource (saturating; may go negative: an overcommitted
    /// node's free amount).
    pub fn sub(&mut self, other: &Resources) {
        for (name, a) in &other.0 {
            let v = self.get(name).saturating_sub(*a);
            self.set(name, v);
        }
    }

    /// Each amount times `n`.
    pub fn times(&self, n: i64) -> Resources {
        Resources(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v.saturating_mul(n)))
                .collect(),
        )
    }

    /// Resource by resource, the larger of the two.
    pub fn max_with(&mut self, other: &Resources) {
        for (name, a) in &other.0 {
            if *a > self.get(name) {
                self.set(name, *a);
            }
        }
    }

    /// True when no resource is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The resources and amounts, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Amount)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// `{cpu: 1, memory: 4Gi, nvidia.com/gpu: 8}` with [`show`]'s units.
    pub fn shown(&self) -> String {
        let parts: Vec<String> = self
            .iter()
            .map(|(k, v)| format!("{k}: {}", show(k, v)))
            .collect();
        format!("{{{}}}", parts.join(", "))
    }

    /// A list from Kubernetes quantities (a container's `requests`, a node's `allocatable`).
    ///
    /// # Errors
    /// The first quantity that is not one, naming its resource.
    pub fn from_quantities<'a>(
        list: impl IntoIterator<
            Item = (
                &'a String,
                &'a k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            ),
        >,
    ) -> Result<Resources, (String, QuantityError)> {
        let mut out = Resources::new();
        for (name, q) in list {
            let a = parse(&q.0).map_err(|e| (name.clone(), e))?;
            out.set(name, a);
        }
        Ok(out)
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quantities_are_read_as_kubernetes_reads_them() {
        for (q, milli) in [
            ("0", 0),
            ("1", 1000),
            ("500m", 500),
            ("0.5", 500),
            ("1.5", 1500),
            (".5", 500),
            ("2.", 2000),
            ("+3", 3000),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("1.5Gi", 1_610_612_736_000),
            ("1Gi", 1_073_741_824_000),
            ("128974848", 128_974_848_000),
            ("129e6", 129_000_000_000),
            ("123Mi", 128_974_848_000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("0.1m", 1),
            ("1.0001m", 2),
            ("8", 8000),
            ("-0", 0),
            ("1Ti", 1_099_511_627_776_000),
        ] {
            assert_eq!(parse(q), Ok(milli), "{q}");
        }
        for bad in ["", "m", "1.2.3", "1X", "abc", "1 Gi", "e3", "1e", "--1"] {
            assert!(
                matches!(parse(bad), Err(QuantityError::Syntax(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        assert!(matches!(parse("-1"), Err(QuantityError::Negative(_))));
        assert!(matches!(parse("10E"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(
            parse("99999999999999999999999"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn amounts_are_shown_in_the_resources_units() {
        assert_eq!(show("cpu", 500), "500m");
        assert_eq!(show("cpu", 1500), "1.5");
        assert_eq!(show("cpu", 2000), "2");
        assert_eq!(show("memory", 4 * (1 << 30) * 1000), "4Gi");
        assert_eq!(show("memory", 1536 * (1 << 20) * 1000), "1536Mi");
        assert_eq!(show("memory", 1000 * 1000), "1000");
        assert_eq!(show("nvidia.com/gpu", 8000), "8");
        assert_eq!(show("pods", 3000), "3");
    }

    proptest! {
        /// An integer count of any unit reads back as itself times the unit, in milli.
        #[test]
        fn integers_with_suffixes(n in 0i64..1_000_000, s in 0usize..5) {
            let (suffix, unit) = [("", 1000i64), ("k", 1_000_000), ("Ki", 1_024_000), ("Mi", 1_048_576_000), ("m", 1)][s];
            prop_assert_eq!(parse(&format!("{n}{suffix}")), Ok(n * unit));
        }

        /// Sums and differences of lists are exact and undo each other.
        #[test]
        fn lists_add_and_subtract_exactly(a in prop::collection::btree_map("[a-c]", 0i64..1_000_000, 0..3),
                                          b in prop::collection::btree_map("[a-c]", 0i64..1_000_000, 0..3)) {
            let (a, b) = (Resources(a.into_iter().filter(|(_, v)| *v != 0).collect()), Resources(b.into_iter().filter(|(_, v)| *v != 0).collect()));
            let mut s = a.clone();
            s.add(&b);
            for (k, v) in s.iter() {
                prop_assert_eq!(v, a.get(k) + b.get(k));
            }
            s.sub(&b);
            prop_assert_eq!(s, a);
        }
    }
}
