//! The subject common name (CN, OID 2.5.4.3) of an X.509 certificate in DER, read with a
//! minimal DER walk. The certificate has already been verified by rustls; this only locates
//! one field, so a full X.509 parser (and its dependency tree) is not needed.
//!
//! Certificate = SEQUENCE { tbsCertificate, .. }; tbsCertificate = SEQUENCE { [0] version
//! (optional), serialNumber, signature, issuer, validity, subject, .. }; a Name is a SEQUENCE
//! of SETs of SEQUENCE { type OID, value }.

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xA0;
/// 2.5.4.3 (id-at-commonName), DER-encoded.
const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];

/// The bytes of the first CN of the subject, as encoded (UTF8String, PrintableString, ...).
pub fn common_name(cert: &[u8]) -> Option<&[u8]> {
    let (tag, cert, _) = tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, mut tbs, _) = tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity: skipped.
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (tag, mut rdns, _) = tlv(tbs)?;
    if tag != SEQUENCE {
        return None;
    }
    while !rdns.is_empty() {
        let (tag, mut set, rest) = tlv(rdns)?;
        rdns = rest;
        if tag != SET {
            return None;
        }
        while !set.is_empty() {
            let (_, attribute, rest) = tlv(set)?;
            set = rest;
            let (tag, oid, value) = tlv(attribute)?;
            if tag == OID && oid == COMMON_NAME {
                return Some(tlv(value)?.1);
            }
        }
    }
    None
}

/// One DER tag-length-value: (tag, contents, what follows). Single-byte tags only (all that
/// the fields above use); lengths up to 4 bytes.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(params: rcgen::CertificateParams) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn finds_the_subject_cn_among_other_attributes() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "Acme");
        params.distinguished_name.push(rcgen::DnType::CommonName, "client-7");
        assert_eq!(common_name(&cert_with(params)), Some(&b"client-7"[..]));
    }

    #[test]
    fn no_cn_is_none_and_garbage_is_none() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "Acme");
        let der = cert_with(params);
        assert_eq!(common_name(&der), None);
        assert_eq!(common_name(b""), None);
        assert_eq!(common_name(&der[..der.len() / 2]), None, "truncated");
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
