//! Delivery receipts (DESIGN §5): every delivery attempt gets its own receipt, a token naming
//! the subscription, the inbox offset, the attempt number and the consumer, with an HMAC over
//! all four. A consumer cannot forge one, nor turn its receipt into another attempt's or
//! another consumer's. Whether the attempt is still the current one is the store's question;
//! this module only says whether the token is genuine and what it names.

use std::fmt::Write as _;

use aws_lc_rs::hmac;

use crate::hex::push_lower_hex;

/// What a receipt names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub subscription: String,
    pub offset: i64,
    pub attempt: u32,
    pub consumer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("not a receipt")]
    Malformed,
    #[error("the receipt was not issued by this gateway")]
    Forged,
}

/// The gateway's receipt key (kept in the store so receipts survive a restart).
pub struct ReceiptKey(hmac::Key);

impl ReceiptKey {
    pub fn new(secret: &[u8]) -> ReceiptKey {
        ReceiptKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }
}

impl Receipt {
    /// The token handed to the consumer: `{offset}.{attempt}.{hex subscription}.{hex consumer}.{hex mac}`.
    pub fn sign(&self, key: &ReceiptKey) -> String {
        // One string, written in place: a fetch signs a receipt for every message it hands
        // out. (Writing to a `String` cannot fail.)
        let hex_len = 2 * (self.subscription.len() + self.consumer.len() + 32);
        let mut token = String::with_capacity(hex_len + 32);
        let _ = write!(token, "{}.{}.", self.offset, self.attempt);
        push_lower_hex(&mut token, self.subscription.as_bytes());
        token.push('.');
        push_lower_hex(&mut token, self.consumer.as_bytes());
        let tag = hmac::sign(&key.0, token.as_bytes());
        token.push('.');
        push_lower_hex(&mut token, tag.as_ref());
        token
    }

    /// Checks a token and returns what it names.
    pub fn verify(token: &str, key: &ReceiptKey) -> Result<Receipt, ReceiptError> {
        let (body, mac) = token.rsplit_once('.').ok_or(ReceiptError::Malformed)?;
        let mac = unhex(mac).ok_or(ReceiptError::Malformed)?;
        let mut parts = body.split('.');
        let (Some(offset), Some(attempt), Some(subscription), Some(consumer), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(ReceiptError::Malformed);
        };
        hmac::verify(&key.0, body.as_bytes(), &mac).map_err(|_| ReceiptError::Forged)?;
        let text = |h: &str| {
            unhex(h)
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or(ReceiptError::Malformed)
        };
        Ok(Receipt {
            subscription: text(subscription)?,
            offset: offset.parse().map_err(|_| ReceiptError::Malformed)?,
            attempt: attempt.parse().map_err(|_| ReceiptError::Malformed)?,
            consumer: text(consumer)?,
        })
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    crate::hex::from_hex(text, 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> Receipt {
        Receipt {
            subscription: "$share/billing/orders/+".into(),
            offset: 42,
            attempt: 2,
            consumer: "session-a".into(),
        }
    }

    #[test]
    fn the_token_names_the_delivery_in_lower_case_hex_then_its_mac() {
        let token = receipt().sign(&ReceiptKey::new(b"a secret of the gateway"));
        let (body, mac) = token.rsplit_once('.').expect("token");
        assert_eq!(
            body,
            "42.2.2473686172652f62696c6c696e672f6f72646572732f2b.73657373696f6e2d61"
        );
        assert_eq!(mac.len(), 64);
        assert!(
            mac.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn round_trip() {
        let key = ReceiptKey::new(b"a secret of the gateway");
        let token = receipt().sign(&key);
        assert_eq!(Receipt::verify(&token, &key), Ok(receipt()));
    }

    #[test]
    fn forged_altered_or_foreign_receipts_are_refused() {
        let key = ReceiptKey::new(b"a secret of the gateway");
        let token = receipt().sign(&key);
        // Another attempt, another consumer: the MAC no longer fits.
        let other_attempt = token.replacen("42.2.", "42.3.", 1);
        assert_eq!(
            Receipt::verify(&other_attempt, &key),
            Err(ReceiptError::Forged)
        );
        let mut other_consumer = receipt();
        other_consumer.consumer = "session-b".into();
        let swapped = {
            let theirs = other_consumer.sign(&key);
            let (their_body, _) = theirs.rsplit_once('.').expect("token");
            let (_, our_mac) = token.rsplit_once('.').expect("token");
            format!("{their_body}.{our_mac}")
        };
        assert_eq!(Receipt::verify(&swapped, &key), Err(ReceiptError::Forged));
        // Issued under another key.
        let foreign = receipt().sign(&ReceiptKey::new(b"someone else"));
        assert_eq!(Receipt::verify(&foreign, &key), Err(ReceiptError::Forged));
        for junk in ["", "x", "1.2.3.4", "1.2.zz.aa.bb", &format!("{token}.00")] {
            assert!(Receipt::verify(junk, &key).is_err(), "{junk}");
        }
    }
}
