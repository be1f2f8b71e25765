//! A throwaway CA and server certificate for HTTPS BMCs.
//!
//! Every BMC shares one server certificate (SANs: the bind address and `localhost`) signed by a CA generated
//! at start. Clients verify against the CA PEM ([`crate::RunningFleet::ca_pem`]; the binary writes it to a
//! file), exactly as they would against a site CA for real BMCs.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub(crate) struct TlsMaterial {
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn generate(bind: IpAddr) -> Result<TlsMaterial, BoxError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "bmc-sim test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params.subject_alt_names.push(SanType::IpAddress(bind));
    params.distinguished_name.push(DnType::CommonName, "bmc-sim");
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    Ok(TlsMaterial {
        ca_pem: ca.pem(),
        server_config: Arc::new(config),
    })
}
