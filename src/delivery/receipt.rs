//! Delivery receipts (DESIGN §5): every delivery attempt gets its own receipt, a token naming
//! the subscription, the inbox offset, the attempt number and the consumer, with a MAC over
//! all four. A consumer cannot forge one, nor turn its receipt into another attempt's or
//! another consumer's. Whether the attempt is still the current one is the store's question;
//! this module only says whether the token is genuine and what it names.
//!
//! The MAC is AES-256-CMAC (NIST SP 800-38B, a 128-bit tag) over the four fields in a binary
//! layout (`Receipt::mac_context`). It was HMAC-SHA256 over the token's text: a fetch signs a
//! receipt per message and a settle checks one, and the two HMACs were a twelfth of a
//! delivered message's instructions where the CMAC, on the processor's AES instructions, is a
//! fraction of that (issue 35). A token signed the earlier way (its tag is 32 bytes, not 16)
//! is still accepted, so receipts in flight across an upgrade settle.

use std::fmt::Write as _;

use aws_lc_rs::error::Unspecified;
use aws_lc_rs::{cmac, hmac};

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

/// A receipt could not be signed (the MAC's primitive failed; it does not for a valid key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot sign a delivery receipt")]
pub struct Unsigned;

/// The gateway's receipt keys, both from its secret (kept in the store so receipts survive a
/// restart).
pub struct ReceiptKey {
    /// Signs and checks receipts.
    cmac: cmac::Key,
    /// Checks the receipts signed before the CMAC: HMAC-SHA256 over the token's text, keyed
    /// with the secret itself.
    earlier: hmac::Key,
}

impl ReceiptKey {
    pub fn new(secret: &[u8]) -> Result<ReceiptKey, Unspecified> {
        let earlier = hmac::Key::new(hmac::HMAC_SHA256, secret);
        // Derived from the secret rather than the secret itself: no two MACs share a key.
        let derived = hmac::sign(&earlier, b"wsr-gateway delivery receipts: AES-256-CMAC key");
        Ok(ReceiptKey {
            cmac: cmac::Key::new(cmac::AES_256, derived.as_ref())?,
            earlier,
        })
    }
}

impl Receipt {
    /// The token handed to the consumer: `{offset}.{attempt}.{hex subscription}.{hex consumer}.{hex mac}`.
    pub fn sign(&self, key: &ReceiptKey) -> Result<String, Unsigned> {
        // One string, written in place: a fetch signs a receipt for every message it hands
        // out. (Writing to a `String` cannot fail.)
        let hex_len = 2 * (self.subscription.len() + self.consumer.len() + 32);
        let mut token = String::with_capacity(hex_len + 32);
        let _ = write!(token, "{}.{}.", self.offset, self.attempt);
        push_lower_hex(&mut token, self.subscription.as_bytes());
        token.push('.');
        push_lower_hex(&mut token, self.consumer.as_bytes());
        let tag = self
            .mac_context(key)
            .and_then(cmac::Context::sign)
            .map_err(|_| Unsigned)?;
        token.push('.');
        push_lower_hex(&mut token, tag.as_ref());
        Ok(token)
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
        let genuine = match mac.len() {
            CMAC_TAG_LEN => receipt
                .mac_context(key)
                .and_then(|c| c.verify(&mac))
                .is_ok(),
            // Signed by a gateway before the CMAC.
            _ => hmac::verify(&key.earlier, body.as_bytes(), &mac).is_ok(),
        };
        if genuine {
            Ok(receipt)
        } else {
            Err(ReceiptError::Forged)
        }
    }

    /// The MAC's context, given everything it covers: `mac_header`, then the subscription's
    /// bytes, then the consumer's.
    fn mac_context(&self, key: &ReceiptKey) -> Result<cmac::Context, Unspecified> {
        let mut mac = cmac::Context::with_key(&key.cmac);
        mac.update(&self.mac_header())?;
        mac.update(self.subscription.as_bytes())?;
        mac.update(self.consumer.as_bytes())?;
        Ok(mac)
    }

    /// A version byte (zero), then big-endian the offset, the attempt and the subscription's
    /// length: with the length, where the subscription ends and the consumer begins is fixed,
    /// so no two receipts sign the same bytes.
    fn mac_header(&self) -> [u8; 17] {
        let mut header = [0u8; 17];
        let subscription_len = u32::try_from(self.subscription.len()).unwrap_or(u32::MAX);
        header[1..9].copy_from_slice(&self.offset.to_be_bytes());
        header[9..13].copy_from_slice(&self.attempt.to_be_bytes());
        header[13..17].copy_from_slice(&subscription_len.to_be_bytes());
        header
    }
}

/// The CMAC's tag, in bytes (the earlier HMAC's is 32).
const CMAC_TAG_LEN: usize = 16;

fn unhex(text: &str) -> Option<Vec<u8>> {
    crate::hex::from_hex(text, 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway_key(secret: &[u8]) -> ReceiptKey {
        ReceiptKey::new(secret).expect("a key")
    }

    fn signed(receipt: &Receipt, key: &ReceiptKey) -> String {
        receipt.sign(key).expect("signed")
    }

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
        let token = signed(&receipt(), &gateway_key(b"a secret of the gateway"));
        let (body, mac) = token.rsplit_once('.').expect("token");
        assert_eq!(
            body,
            "42.2.2473686172652f62696c6c696e672f6f72646572732f2b.73657373696f6e2d61"
        );
        assert_eq!(mac.len(), 2 * CMAC_TAG_LEN);
        assert!(
            mac.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn round_trip() {
        let key = gateway_key(b"a secret of the gateway");
        let token = signed(&receipt(), &key);
        assert_eq!(Receipt::verify(&token, &key), Ok(receipt()));
    }

    #[test]
    fn forged_altered_or_foreign_receipts_are_refused() {
        let key = gateway_key(b"a secret of the gateway");
        let token = signed(&receipt(), &key);
        // Another attempt, another consumer: the MAC no longer fits.
        let other_attempt = token.replacen("42.2.", "42.3.", 1);
        assert_eq!(
            Receipt::verify(&other_attempt, &key),
            Err(ReceiptError::Forged)
        );
        let mut other_consumer = receipt();
        other_consumer.consumer = "session-b".into();
        let swapped = {
            let theirs = signed(&other_consumer, &key);
            let (their_body, _) = theirs.rsplit_once('.').expect("token");
            let (_, our_mac) = token.rsplit_once('.').expect("token");
            format!("{their_body}.{our_mac}")
        };
        assert_eq!(Receipt::verify(&swapped, &key), Err(ReceiptError::Forged));
        // Issued under another key.
        let foreign = signed(&receipt(), &gateway_key(b"someone else"));
        assert_eq!(Receipt::verify(&foreign, &key), Err(ReceiptError::Forged));
        for junk in ["", "x", "1.2.3.4", "1.2.zz.aa.bb", &format!("{token}.00")] {
            assert!(Receipt::verify(junk, &key).is_err(), "{junk}");
        }
    }

    #[test]
    fn a_receipt_signed_over_its_text_by_an_earlier_gateway_is_still_genuine() {
        let key = gateway_key(b"a secret of the gateway");
        let token = signed(&receipt(), &key);
        let (body, mac) = token.rsplit_once('.').expect("token");
        let mut earlier = format!("{body}.");
        push_lower_hex(
            &mut earlier,
            hmac::sign(&key.earlier, body.as_bytes()).as_ref(),
        );
        assert_ne!(earlier.rsplit_once('.').expect("token").1, mac);
        assert_eq!(Receipt::verify(&earlier, &key), Ok(receipt()));
        let other_attempt = earlier.replacen("42.2.", "42.3.", 1);
        assert_eq!(
            Receipt::verify(&other_attempt, &key),
            Err(ReceiptError::Forged)
        );
    }

    #[test]
    fn where_the_subscription_ends_and_the_consumer_begins_is_signed() {
        let key = gateway_key(b"a secret of the gateway");
        let split = |subscription: &str, consumer: &str| Receipt {
            subscription: subscription.into(),
            offset: 7,
            attempt: 1,
            consumer: consumer.into(),
        };
        let ours = signed(&split("12", "3abc"), &key);
        let theirs = signed(&split("123", "abc"), &key);
        let (their_body, _) = theirs.rsplit_once('.').expect("token");
        let (_, our_mac) = ours.rsplit_once('.').expect("token");
        let moved = format!("{their_body}.{our_mac}");
        assert_eq!(Receipt::verify(&moved, &key), Err(ReceiptError::Forged));
        assert_eq!(Receipt::verify(&theirs, &key), Ok(split("123", "abc")));
    }
}
