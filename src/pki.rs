//! Generated certificates for the simulated apiserver, the demo and tests.
//!
//! Production certificates come from files (see `tls`); these exist so a
//! fresh clone can run the demo and every test without external tools.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that issues serving and client certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

// === impl Ca ===

impl Ca {
    /// A new self-signed CA with the given common name.
    ///
    /// # Errors
    /// When key generation or signing fails.
    pub fn new(common_name: &str) -> Result<Ca, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Ca { issuer })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for the given DNS names and IP addresses.
    ///
    /// # Errors
    /// When a name is not a valid DNS name or signing fails.
    pub fn issue_server(&self, dns_names: &[&str], ips: &[IpAddr]) -> Result<Issued, rcgen::Error> {
        let sans: Vec<String> = dns_names
            .iter()
            .map(|s| s.to_string())
            .chain(ips.iter().map(IpAddr::to_string))
            .collect();
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().copied().unwrap_or("server"),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params)
    }

    /// A client certificate for user `common_name` in group `organization`
    /// (the apiserver maps CN to the user name and O to groups).
    ///
    /// rcgen keeps one value per attribute type, so at most one group.
    ///
    /// # Errors
    /// When signing fails.
    pub fn issue_client(
        &self,
        common_name: &str,
        organization: Option<&str>,
    ) -> Result<Issued, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(o) = organization {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Issued, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_parseable_certificates() {
        let ca = Ca::new("test-ca").unwrap();
        let server = ca
            .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
            .unwrap();
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.key_pem.contains("PRIVATE KEY"));
        let client = ca
            .issue_client("system:node:n1", Some("system:nodes"))
            .unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(client.cert_pem.as_bytes());
        let der: rustls_pki_types::CertificateDer<'_> = der.unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap();
        assert_eq!(cn, "system:node:n1");
    }
}
