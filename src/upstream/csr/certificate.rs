//! What the serving certificate must contain ([`Template`]: the subject
//! and SANs `kubernetes.io/kubelet-serving` requires, and the PEM request
//! for a key), what a certificate holds ([`LeafInfo`]), and the temporary
//! self-signed certificate served until one is issued.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::component::config::CsrConfig;

/// The group the `kubernetes.io/kubelet-serving` signer requires.
const NODES_GROUP: &str = "system:nodes";
/// Lifetime of the temporary self-signed certificate.
const TEMPORARY_VALIDITY_SECONDS: i64 = 24 * 3600;

/// What the certificate must contain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Template {
    pub(super) common_name: String,
    pub(super) organization: String,
    pub(super) dns_names: Vec<String>,
    pub(super) ip_addresses: Vec<IpAddr>,
}

impl Template {
    pub(super) fn new(csr: &CsrConfig, node_name: &str) -> Template {
        Template {
            common_name: format!("system:node:{node_name}"),
            organization: NODES_GROUP.to_string(),
            dns_names: csr.dns_names(node_name),
            ip_addresses: csr.ip_addresses(),
        }
    }

    fn params(&self) -> Result<CertificateParams, rcgen::Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, self.organization.as_str());
        params
            .distinguished_name
            .push(DnType::CommonName, self.common_name.as_str());
        for name in &self.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(name.clone().try_into()?));
        }
        for ip in &self.ip_addresses {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        Ok(params)
    }

    /// The PEM certificate request for `key`.
    pub(super) fn request(&self, key: &KeyPair) -> Result<String, rcgen::Error> {
        self.params()?.serialize_request(key)?.pem()
    }

    /// Whether a certificate's subject and SANs are exactly these.
    pub(super) fn satisfied_by(&self, leaf: &LeafInfo) -> bool {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.dedup();
            v
        };
        let mut ips = self.ip_addresses.clone();
        ips.sort();
        ips.dedup();
        leaf.common_name == self.common_name
            && leaf.organizations == [self.organization.clone()]
            && sorted(&leaf.dns_names) == sorted(&self.dns_names)
            && leaf.ip_addresses == ips
    }
}

/// What the proxy reads from a certificate.
#[derive(Debug, Clone)]
pub(super) struct LeafInfo {
    pub(super) not_before: i64,
    pub(super) not_after: i64,
    pub(super) common_name: String,
    /// Sorted.
    pub(super) organizations: Vec<String>,
    pub(super) dns_names: Vec<String>,
    /// Sorted, deduplicated.
    pub(super) ip_addresses: Vec<IpAddr>,
}

impl LeafInfo {
    fn parse(der: &[u8]) -> Result<LeafInfo, String> {
        use x509_parser::prelude::{GeneralName, ParsedExtension};
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
        let validity = cert.validity();
        let subject = cert.subject();
        let mut info = LeafInfo {
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
            common_name: subject
                .iter_common_name()
                .find_map(|a| a.as_str().ok())
                .unwrap_or_default()
                .to_string(),
            organizations: subject
                .iter_organization()
                .filter_map(|a| a.as_str().ok())
                .map(str::to_string)
                .collect(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
        };
        info.organizations.sort();
        for ext in cert.extensions() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(d) => info.dns_names.push((*d).to_string()),
                        GeneralName::IPAddress(b) => {
                            if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                                info.ip_addresses.push(IpAddr::from(v4));
                            } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                                info.ip_addresses.push(IpAddr::from(v6));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        info.ip_addresses.sort();
        info.ip_addresses.dedup();
        Ok(info)
    }
}

pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub(super) fn timestamp(secs: i64) -> String {
    jiff::Timestamp::from_second(secs).map_or_else(|_| secs.to_string(), |t| t.to_string())
}

/// A certificate chain and its key from PEM.
pub(super) fn parse_pair(pem: &[u8]) -> Result<(LeafInfo, CertifiedKey), String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let leaf = chain.first().ok_or("no PEM certificate")?;
    let info = LeafInfo::parse(leaf)?;
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("private key: {e}"))?;
    let certified = CertifiedKey::from_der(chain, key, &crate::component::certs::provider())
        .map_err(|e| e.to_string())?;
    Ok((info, certified))
}

/// A self-signed certificate for the configured names, served until an
/// issued one arrives. No client trusts it: it only lets the listener
/// start.
pub(super) fn temporary(template: &Template) -> Result<CertifiedKey, String> {
    let err = |e: rcgen::Error| format!("generating a temporary certificate: {e}");
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(err)?;
    let mut params = template.params().map_err(err)?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(
        DnType::CommonName,
        "kube-cache-proxy temporary certificate (awaiting CSR approval)",
    );
    let now = x509_parser::time::ASN1Time::now().timestamp();
    let at = |t: i64| {
        x509_parser::time::ASN1Time::from_timestamp(t)
            .map(|t| t.to_datetime())
            .map_err(|e| e.to_string())
    };
    params.not_before = at(now - 60)?;
    params.not_after = at(now + TEMPORARY_VALIDITY_SECONDS)?;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key).map_err(err)?;
    let key_der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    CertifiedKey::from_der(
        vec![cert.der().clone()],
        key_der,
        &crate::component::certs::provider(),
    )
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::renew::Served;
    use super::*;

    fn template() -> Template {
        Template::new(
            &CsrConfig {
                enabled: true,
                ..CsrConfig::default()
            },
            "node-1",
        )
    }

    #[test]
    fn signed_certificate_satisfies_the_template() {
        let ca = apimachinery::pki::Ca::new("signer").unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let t = template();
        let cert = ca
            .sign_csr(&t.request(&key).unwrap(), Duration::from_secs(100))
            .unwrap();
        let mut pem = cert.into_bytes();
        pem.extend_from_slice(key.serialize_pem().as_bytes());
        let (leaf, _) = parse_pair(&pem).unwrap();
        assert!(t.satisfied_by(&leaf));
        assert!((99..=101).contains(&(leaf.not_after - leaf.not_before)));
        let served = Served::new(leaf.clone(), &t);
        let lifetime = (leaf.not_after - leaf.not_before) as f64;
        let at = (served.renew_at - leaf.not_before as f64) / lifetime;
        assert!((0.7..=0.9).contains(&at), "{at}");
        // Another node's template is not satisfied.
        let other = Template::new(
            &CsrConfig {
                enabled: true,
                ..CsrConfig::default()
            },
            "node-2",
        );
        assert!(!other.satisfied_by(&leaf));
        // A key that is not the certificate's is refused.
        let wrong = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut pem = ca
            .sign_csr(&t.request(&key).unwrap(), Duration::from_secs(100))
            .unwrap()
            .into_bytes();
        pem.extend_from_slice(wrong.serialize_pem().as_bytes());
        assert!(parse_pair(&pem).is_err());
    }

    #[test]
    fn temporary_certificate_loads() {
        let key = temporary(&template()).unwrap();
        let leaf = LeafInfo::parse(&key.cert[0]).unwrap();
        assert_eq!(leaf.dns_names, ["localhost", "node-1"]);
    }
}
