//! Resource quantities (`500m`, `1Gi`, `2e3`): parsing to an exact integer of nano-units so
//! that requests can be compared with limits and QoS classes computed without floating point.
//!
//! Invariant: a parsed quantity is exact for every value Kubernetes can represent to nano
//! precision; finer fractions round up, as Kubernetes' `Quantity` rounds up to its smallest
//! scale. Magnitudes past `i128` saturate rather than wrap.

/// The message Kubernetes gives for a string that is not a quantity
/// (apimachinery `resource.ErrFormatWrong`).
pub const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Nano-units per unit: quantities are compared at 10^-9, Kubernetes' finest scale.
const NANO_PER_UNIT: i128 = 1_000_000_000;

/// A quantity as signed nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(pub i128);

impl Quantity {
    /// Parses Kubernetes' quantity syntax; `None` when the string is not a quantity.
    pub fn parse(text: &str) -> Option<Quantity> {
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = rest
            .bytes()
            .position(|c| !(c.is_ascii_digit() || c == b'.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        // (multiplier base, exponent): value = number * base^exponent.
        let (base, exponent): (i128, i32) = match suffix {
            "" => (10, 0),
            "n" => (10, -9),
            "u" => (10, -6),
            "m" => (10, -3),
            "k" => (10, 3),
            "M" => (10, 6),
            "G" => (10, 9),
            "T" => (10, 12),
            "P" => (10, 15),
            "E" => (10, 18),
            "Ki" => (2, 10),
            "Mi" => (2, 20),
            "Gi" => (2, 30),
            "Ti" => (2, 40),
            "Pi" => (2, 50),
            "Ei" => (2, 60),
            _ => {
                let digits = suffix.strip_prefix(['e', 'E'])?;
                let digits_only = digits.strip_prefix(['+', '-']).unwrap_or(digits);
                if digits_only.is_empty() || !digits_only.bytes().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                (10, digits.parse::<i32>().ok()?)
            }
        };
        // mantissa = whole.fraction as an integer scaled by 10^-fraction_len.
        let mut mantissa: i128 = 0;
        for c in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .saturating_mul(10)
                .saturating_add(i128::from(c - b'0'));
        }
        let fraction_len = i32::try_from(fraction.len()).ok()?;
        let nano = if base == 2 {
            let scaled = mantissa
                .saturating_mul(NANO_PER_UNIT)
                .saturating_mul(1i128 << exponent);
            div_round_up(scaled, pow10(fraction_len))
        } else {
            let shift = exponent + 9 - fraction_len;
            if shift >= 0 {
                mantissa.saturating_mul(pow10(shift))
            } else {
                div_round_up(mantissa, pow10(-shift))
            }
        };
        Some(Quantity(if negative { -nano } else { nano }))
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }
}

fn pow10(exponent: i32) -> i128 {
    let mut value: i128 = 1;
    for _ in 0..exponent.max(0) {
        value = value.saturating_mul(10);
    }
    value
}

fn div_round_up(numerator: i128, denominator: i128) -> i128 {
    if denominator >= i128::MAX / 2 {
        return i128::from(numerator > 0);
    }
    (numerator + denominator - 1) / denominator
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> i128 {
        Quantity::parse(s).expect("test quantity parses").0
    }

    #[test]
    fn parses_kubernetes_suffixes() {
        assert_eq!(q("1"), 1_000_000_000);
        assert_eq!(q("500m"), 500_000_000);
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1Ki"), 1024 * 1_000_000_000);
        assert_eq!(q("1.5Gi"), 3 * (1i128 << 29) * 1_000_000_000);
        assert_eq!(q("2e3"), q("2k"));
        assert_eq!(q("1E"), 10i128.pow(27));
        assert_eq!(q("-1"), -1_000_000_000);
        assert_eq!(q("1n"), 1);
        assert_eq!(q("0.1n"), 1, "sub-nano fractions round up");
    }

    #[test]
    fn rejects_non_quantities() {
        for bad in ["", "abc", "1x", "1.2.3", "Mi", "1e", "--1", "1 Gi"] {
            assert!(Quantity::parse(bad).is_none(), "{bad:?} should not parse");
        }
    }
}
