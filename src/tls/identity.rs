//! The subject common name (CN, OID 2.5.4.3) of an X.509 certificate in DER. The certificate
//! has already been verified by rustls; this only reads one field, with `x509-parser` (no
//! hand-written ASN.1).

use x509_parser::prelude::{FromDer, X509Certificate};

/// The bytes of the first CN of the subject, as encoded (UTF8String, PrintableString, ...).
/// None when the certificate does not parse or its subject has no CN.
pub fn common_name(cert: &[u8]) -> Option<&[u8]> {
    let (_, parsed) = X509Certificate::from_der(cert).ok()?;
    // The field, not `subject()`: the accessor's lifetime is the parsed certificate's, the
    // field's is the input's, which the returned bytes borrow.
    let cn = parsed.tbs_certificate.subject.iter_common_name().next()?;
    Some(cn.attr_value().data)
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
