//! Delivery receipts (DESIGN §5): every delivery attempt gets its own receipt, a token naming
//! the subscription, the inbox offset, the attempt number and the consumer, with an HMAC over
//! all four. A consumer cannot forge one, nor turn its receipt into another attempt's or
//! another consumer's. Whether the attempt is still the current one is the store's question;
//! this module only says whether the token is genuine and what it names.
//!
//! The MAC covers the four fields in a binary layout (`Receipt::mac`), not the token's text: for a
//! gateway's subscription ids and session ids that is under 56 bytes, one SHA-256 block where
//! the hex text took two — a fetch signs a receipt per message and a settle checks one, and
//! the block was a tenth of a delivered message's cost in the consumers' requests (issue 35).
//! A token signed over its text (before that change) is still accepted.

use std::fmt::Write as _;

use aws_lc_rs::{constant_time, hmac};

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
        let tag = self.mac(key);
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
        let text = |h: &str| {
            unhex(h)
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or(ReceiptError::Malformed)
        };
        let receipt = Receipt {
            subscription: text(subscription)?,
            offset: offset.parse().map_err(|_| ReceiptError::Malformed)?,
            attempt: attempt.parse().map_err(|_| ReceiptError::Malformed)?,
            consumer: text(consumer)?,
        };
        let genuine = constant_time::verify_slices_are_equal(receipt.mac(key).as_ref(), &mac)
            .is_ok()
            // Signed over the token's text, by a gateway before the binary layout.
            || hmac::verify(&key.0, body.as_bytes(), &mac).is_ok();
        if genuine {
            Ok(receipt)
        } else {
            Err(ReceiptError::Forged)
        }
    }

    /// The receipt's MAC: over `mac_header`, then the subscription's bytes, then the
    /// consumer's.
    fn mac(&self, key: &ReceiptKey) -> hmac::Tag {
        let mut mac = hmac::Context::with_key(&key.0);
        mac.update(&self.mac_header());
        mac.update(self.subscription.as_bytes());
        mac.update(self.consumer.as_bytes());
        mac.sign()
    }

    /// A zero byte (no token's text starts with one, so the two layouts never sign the same
    /// bytes), then big-endian the offset, the attempt and the subscription's length: with the
    /// length, where the subscription ends and the consumer begins is fixed, so no two
    /// receipts sign the same bytes.
    fn mac_header(&self) -> [u8; 17] {
        let mut header = [0u8; 17];
        let subscription_len = u32::try_from(self.subscription.len()).unwrap_or(u32::MAX);
        header[1..9].copy_from_slice(&self.offset.to_be_bytes());
        header[9..13].copy_from_slice(&self.attempt.to_be_bytes());
        header[13..17].copy_from_slice(&subscription_len.to_be_bytes());
        header
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

    #[test]
    fn a_receipt_signed_over_its_text_by_an_earlier_gateway_is_still_genuine() {
        let key = ReceiptKey::new(b"a secret of the gateway");
        let token = receipt().sign(&key);
        let (body, mac) = token.rsplit_once('.').expect("token");
        let mut earlier = format!("{body}.");
        push_lower_hex(&mut earlier, hmac::sign(&key.0, body.as_bytes()).as_ref());
        assert_ne!(earlier.rsplit_once('.').expect("token").1, mac);
        assert_eq!(Receipt::verify(&earlier, &key), Ok(receipt()));
    }

    #[test]
    fn where_the_subscription_ends_and_the_consumer_begins_is_signed() {
        let key = ReceiptKey::new(b"a secret of the gateway");
        let split = |subscription: &str, consumer: &str| Receipt {
            subscription: subscription.into(),
            offset: 7,
            attempt: 1,
            consumer: consumer.into(),
        };
        let ours = split("12", "3abc").sign(&key);
        let theirs = split("123", "abc").sign(&key);
        let (their_body, _) = theirs.rsplit_once('.').expect("token");
        let (_, our_mac) = ours.rsplit_once('.').expect("token");
        let moved = format!("{their_body}.{our_mac}");
        assert_eq!(Receipt::verify(&moved, &key), Err(ReceiptError::Forged));
        assert_eq!(Receipt::verify(&theirs, &key), Ok(split("123", "abc")));
    }
}
