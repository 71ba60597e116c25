//! Generated certificates for the simulated apiserver, the demo and tests.
//!
//! Production certificates come from files (see `tls`); these exist so a
//! fresh clone can run the demo and every test without external tools.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PublicKeyData,
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

    /// Signs a PEM certificate signing request as a serving certificate,
    /// valid from now for `validity`, the way kube-controller-manager's
    /// `kubernetes.io/kubelet-serving` signer does once a request is
    /// approved: the request's subject (CN and the first O) and DNS and IP
    /// SANs, key usage `digitalSignature`, extended key usage `serverAuth`.
    /// Returns the certificate, PEM. For tests that play the signer.
    ///
    /// # Errors
    /// When the request does not parse, its signature does not verify, its
    /// key is not ECDSA P-256, or signing fails.
    pub fn sign_csr(&self, csr_pem: &str, validity: Duration) -> Result<String, rcgen::Error> {
        use rustls_pki_types::CertificateSigningRequestDer;
        use rustls_pki_types::pem::PemObject;
        use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension};

        let unparsable = rcgen::Error::CouldNotParseCertificationRequest;
        let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
            .map_err(|_| unparsable.clone())?;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
                .map_err(|_| unparsable.clone())?;
        let info = &csr.certification_request_info;
        // The request must be signed by the key it names (by any algorithm
        // rustls verifies; one for another kind of key just fails).
        let spki = &info.subject_pki;
        let public_key = spki.subject_public_key.data.as_ref();
        let signature = csr.signature_value.data.as_ref();
        let verified = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all
            .iter()
            .any(|alg| {
                alg.verify_signature(public_key, info.raw, signature)
                    .is_ok()
            });
        if !verified {
            return Err(unparsable);
        }
        // Only ECDSA P-256 keys (id-ecPublicKey with prime256v1).
        let p256 = spki.algorithm.algorithm.to_id_string() == "1.2.840.10045.2.1"
            && spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .is_some_and(|oid| oid.to_id_string() == "1.2.840.10045.3.1.7");
        if !p256 {
            return Err(rcgen::Error::UnsupportedSignatureAlgorithm);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let org = info
            .subject
            .iter_organization()
            .find_map(|a| a.as_str().ok());
        if let Some(o) = org {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        let cn = info
            .subject
            .iter_common_name()
            .find_map(|a| a.as_str().ok());
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        for ext in csr.requested_extensions().into_iter().flatten() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(dns) => params.subject_alt_names.push(
                            rcgen::SanType::DnsName(rcgen::string::Ia5String::try_from(*dns)?),
                        ),
                        GeneralName::IPAddress(octets) => {
                            let ip = match octets.len() {
                                4 => <[u8; 4]>::try_from(*octets).map(IpAddr::from).ok(),
                                16 => <[u8; 16]>::try_from(*octets).map(IpAddr::from).ok(),
                                _ => None,
                            };
                            let ip =
                                ip.ok_or(rcgen::Error::InvalidIpAddressOctetLength(octets.len()))?;
                            params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
                        }
                        _ => return Err(rcgen::Error::UnsupportedInCsr),
                    }
                }
            }
        }
        let now = x509_parser::time::ASN1Time::now();
        let secs = i64::try_from(validity.as_secs()).unwrap_or(i64::MAX);
        let until =
            x509_parser::time::ASN1Time::from_timestamp(now.timestamp().saturating_add(secs))
                .map_err(|_| rcgen::Error::Time)?;
        params.not_before = now.to_datetime();
        params.not_after = until.to_datetime();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = RequestKey(public_key.to_vec());
        Ok(params.signed_by(&key, &self.issuer)?.pem())
    }

    /// A certificate for `params` (any subject, validity and usages, as
    /// tests of expired or odd certificates need) with a fresh key.
    ///
    /// # Errors
    /// When signing fails.
    pub fn issue(&self, params: CertificateParams) -> Result<Issued, rcgen::Error> {
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

/// The ECDSA P-256 public key of a certificate signing request.
struct RequestKey(Vec<u8>);

impl PublicKeyData for RequestKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn signs_requests_signed_by_their_key() {
        let ca = Ca::new("signer").unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params =
            CertificateParams::new(vec!["node-1".to_string(), "127.0.0.1".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "system:node:node-1");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        let cert = ca.sign_csr(&pem, Duration::from_secs(60)).unwrap();
        let der: rustls_pki_types::CertificateDer<'_> =
            rustls_pki_types::pem::PemObject::from_pem_slice(cert.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(
            parsed.public_key().raw,
            key.subject_public_key_info().as_slice()
        );
        let validity = parsed.validity();
        assert_eq!(
            validity.not_after.timestamp() - validity.not_before.timestamp(),
            60
        );
        // A tampered request (its signature no longer matches) is refused.
        let mut der =
            rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
                .map(|d| d.as_ref().to_vec())
                .unwrap();
        let at = der.windows(6).position(|w| w == b"node-1").unwrap();
        der[at + 5] = b'2';
        let tampered = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &der)
        );
        assert!(matches!(
            ca.sign_csr(&tampered, Duration::from_secs(60)),
            Err(rcgen::Error::CouldNotParseCertificationRequest)
        ));
        // Untampered, the same encoding is signed.
        let original =
            rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).unwrap();
        let reencoded = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                original.as_ref()
            )
        );
        assert!(ca.sign_csr(&reencoded, Duration::from_secs(60)).is_ok());
    }

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
