//! `wsse:Security` (WS-Security 1.0/1.1) addressed to us. We understand a UsernameToken and a
//! Timestamp in it; anything else — a signature, encryption, a binary token — we do not, and
//! such a block that must be understood gets SOAP's MustUnderstand fault as before.

use super::BlockReader;
use crate::wsr::defect::Defect;
use crate::wsr::model::{PASSWORD_DIGEST, UsernameToken};
use crate::wsr::read::xml::{Elem, Ns};

/// What a `wsse:Security` block holds, as far as we understand it.
pub enum SecurityBlock {
    /// Only what we understand: its UsernameToken, if it has one.
    Understood(Option<UsernameToken>),
    /// Something we do not process (a signature, encryption, another token type).
    NotUnderstood,
}

impl<'a> BlockReader<'_, 'a, '_> {
    pub fn security(&mut self, e: &Elem<'a>) -> Result<SecurityBlock, Defect> {
        let mut token = None;
        let mut understood = true;
        self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsse, "UsernameToken") if token.is_none() => {
                token = Some(r.username_token(&child)?);
                Ok(())
            }
            // Its times are only informative to us: the token's own Created is checked.
            (Ns::Wsu, "Timestamp") => Ok(r.xml.skip(&child)?),
            _ => {
                understood = false;
                Ok(r.xml.skip(&child)?)
            }
        })?;
        Ok(match understood {
            true => SecurityBlock::Understood(token),
            false => SecurityBlock::NotUnderstood,
        })
    }

    /// A UsernameToken's values as written; an element with child elements where text
    /// belongs reads as empty (and so proves nothing).
    fn username_token(&mut self, e: &Elem<'a>) -> Result<UsernameToken, Defect> {
        let mut token = UsernameToken {
            username: String::new(),
            password: None,
            digest: false,
            nonce: None,
            created: None,
        };
        self.for_children(e, &mut |r, child| {
            let field = match (child.ns, child.local()) {
                (Ns::Wsse, "Username") => &mut token.username,
                (Ns::Wsse, "Password") => {
                    let kind = r.named_attributes(&child, ["Type"])?.values[0].take();
                    token.digest = kind.as_deref().map(str::trim) == Some(PASSWORD_DIGEST);
                    token.password.insert(String::new())
                }
                (Ns::Wsse, "Nonce") => token.nonce.insert(String::new()),
                (Ns::Wsu, "Created") => token.created.insert(String::new()),
                // Key derivation (wsse11:Salt, Iteration) and extensions: not ours.
                _ => return Ok(r.xml.skip(&child)?),
            };
            *field = r
                .xml
                .text(&child)?
                .map(|t| t.trim().to_owned())
                .unwrap_or_default();
            Ok(())
        })?;
        Ok(token)
    }
}
