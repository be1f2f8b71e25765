//! The controller's own connect failures (EMFILE, ENFILE) injected through the transport's
//! connector seam travel reqwest's real error chain and come out as `ControllerResource`, never as
//! `Unreachable` (which the engine would charge to the node), for reads and for a non-idempotent
//! reset alike; with the seam quiet the same driver works, and a BMC that is really gone stays
//! `Unreachable`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::Duration;

use bmc_sim::{Fleet, FleetOptions, Scenario};
use chrono::Utc;
use orchestrator_bmc::{
    Bmc, BmcEndpoint, BmcError, ConnectFaults, ControllerFault, Credentials, HttpClients, RedfishBmc, ResetKind,
    ResetTarget, RetryPolicy, Timeouts,
};
use orchestrator_types::ManualClock;

const SMALL: &str = include_str!("../../../bmc-sim/scenarios/small.yaml");
const PASSWORD: &str = "sim-Passw0rd";

/// Fails every new connection with the OS error held (0: connect normally) and counts attempts.
#[derive(Debug, Default)]
struct Injected {
    errno: AtomicI32,
    connects: AtomicUsize,
}

impl ConnectFaults for Injected {
    fn on_connect(&self) -> Option<std::io::Error> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        match self.errno.load(Ordering::SeqCst) {
            0 => None,
            code => Some(std::io::Error::from_raw_os_error(code)),
        }
    }
}

fn endpoint(url: &str) -> BmcEndpoint {
    BmcEndpoint::new(url.parse().expect("url"), Credentials::new("root", PASSWORD))
        .with_timeouts(Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(2),
            upload: Duration::from_secs(10),
            probe: Duration::from_secs(1),
        })
        .with_retry(RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
            max_retry_after: Duration::from_millis(50),
            deadline: Duration::from_secs(10),
        })
}

#[tokio::test]
async fn injected_emfile_and_enfile_are_the_controllers_not_the_bmcs() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let mut options = FleetOptions::new(clock);
    options.username = "root".into();
    options.password = PASSWORD.into();
    options.nodes = Some(1);
    let fleet = Fleet::start(Scenario::from_yaml_str(SMALL).expect("scenario"), options)
        .await
        .expect("fleet");
    let faults = Arc::new(Injected::default());
    let clients = HttpClients::with_connect_faults(faults.clone());
    let bmc = RedfishBmc::new(&endpoint(&fleet.endpoints()[0].bmc_url), &clients).expect("driver");

    for (errno, want) in [
        (24, ControllerFault::ProcessFileLimit),
        (23, ControllerFault::SystemFileLimit),
    ] {
        faults.errno.store(errno, Ordering::SeqCst);
        let before = faults.connects.load(Ordering::SeqCst);
        let err = bmc.firmware_inventory().await.expect_err("no descriptors, no read");
        match &err {
            BmcError::ControllerResource { resource, .. } => assert_eq!(*resource, want),
            other => panic!("os error {errno} should be the controller's, got {other:?}"),
        }
        assert!(err.is_controller_fault() && err.is_transient(), "{err}");
        assert_eq!(err.kind(), "controller_resource");
        // Reported at once: retrying inside the driver would only deepen a descriptor storm.
        assert_eq!(
            faults.connects.load(Ordering::SeqCst) - before,
            1,
            "no retries on a controller fault"
        );

        // A reset (its lookups, then its non-idempotent POST) fails the same way: a connect that
        // failed sent nothing, so this is never an unknown outcome.
        let err = bmc
            .reset(&ResetTarget::System(None), ResetKind::GracefulRestart)
            .await
            .expect_err("no descriptors, no reset");
        assert!(matches!(err, BmcError::ControllerResource { .. }), "{err:?}");
    }

    // The condition clears: the same driver and clients work again.
    faults.errno.store(0, Ordering::SeqCst);
    let inventory = bmc
        .firmware_inventory()
        .await
        .expect("inventory once descriptors are back");
    assert!(!inventory.is_empty());

    // Evidence about the BMC stays the BMC's: a port nobody listens on is `Unreachable`.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let gone = RedfishBmc::new(&endpoint(&format!("http://{closed}")), &clients).expect("driver");
    let err = gone.firmware_inventory().await.expect_err("nobody listens");
    assert!(matches!(err, BmcError::Unreachable { .. }), "{err:?}");
    assert!(!err.is_controller_fault());
}
