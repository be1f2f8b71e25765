//! `waveguard`: the firmware rollout controller's one binary.

mod cmd;
mod config;
mod logging;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use orchestrator_db::{Db, DbError};
use orchestrator_types::SystemClock;

use crate::config::{Config, FileConfig, LogFormat, Overrides};

/// jemalloc, not glibc's malloc: the controller frees most of what it allocates within a pass, on
/// many threads (tokio workers, SQLite's blocking pool), and glibc kept those frees in per-thread
/// arenas: at 10,000 nodes the process held 492 MiB for a heap that peaked near a third of that.
/// With jemalloc the same run peaked at 357 MiB and used 29% less CPU per node-update
/// (BENCHMARKS.md, "Controller memory"). It serves SQLite's own allocations too (the feature
/// enables `unprefixed_malloc_on_supported_platforms`): glibc's `malloc_consolidate` and
/// `_int_malloc` under SQLite's worker threads were still about 5% of the controller's CPU.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The `--help` heading of the options every command takes, so a command's
/// own options are not lost among them.
const GLOBAL_OPTIONS: &str = "Global options";

/// Firmware staged-rollout orchestrator for AI-accelerator fleets.
///
/// Settings come from (lowest to highest precedence) built-in defaults, the
/// TOML file given by --config, WAVEGUARD_* environment variables, and flags.
#[derive(Debug, Parser)]
#[command(name = "waveguard", version, about, long_about = None)]
struct Cli {
    /// TOML configuration file (database_url, listen, log_format, log_level,
    /// [credentials.NAME], [policy]).
    #[arg(
        long,
        global = true,
        env = "WAVEGUARD_CONFIG",
        value_name = "FILE",
        help_heading = GLOBAL_OPTIONS
    )]
    config: Option<PathBuf>,

    /// Database URL: sqlite://PATH (default sqlite://waveguard.db, created
    /// if missing) or postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        global = true,
        env = "WAVEGUARD_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true,
        help_heading = GLOBAL_OPTIONS
    )]
    database_url: Option<String>,

    /// Log format.
    #[arg(long, global = true, env = "WAVEGUARD_LOG_FORMAT", value_enum, help_heading = GLOBAL_OPTIONS)]
    log_format: Option<LogFormat>,

    /// Log filter, e.g. `info` or `info,orchestrator_engine=debug`.
    #[arg(
        long,
        global = true,
        env = "WAVEGUARD_LOG",
        value_name = "FILTER",
        help_heading = GLOBAL_OPTIONS
    )]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller: API, metrics and web UI on --listen.
    Serve(cmd::serve::ServeArgs),
    /// Apply pending database migrations and exit.
    Migrate,
    /// Manage the fleet of nodes.
    #[command(subcommand)]
    Fleet(cmd::fleet::FleetCommand),
    /// Manage firmware releases and their qualification.
    #[command(subcommand)]
    Release(cmd::release::ReleaseCommand),
    /// Rollout policies: lint files, sync them from git, show what is in force.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCommand),
    /// Web UI users and API tokens.
    #[command(subcommand)]
    User(cmd::user::UserCommand),
    /// Start, inspect, approve, pause, resume, abort and roll back rollouts.
    #[command(subcommand)]
    Rollout(cmd::rollout::RolloutCommand),
    /// RMA cases: list and show them, record the vendor's answer, the replacement, the verification.
    #[command(subcommand)]
    Rma(cmd::rma::RmaCommand),
    /// Run one rollout headless against a simulated fleet and write a JSON report.
    Simulate(cmd::simulate::SimulateArgs),
    /// Run the whole product on a simulated fleet with the web UI and a story to watch.
    Demo(cmd::demo::DemoArgs),
    /// Run the benchmarks (throughput, scale, detection) and print the figures.
    Bench(cmd::bench::BenchArgs),
    /// The demo fleet's workload scheduler, run by the demo's controller
    /// through the command adapter.
    #[command(hide = true)]
    DemoScheduler(cmd::demo_scheduler::DemoSchedulerArgs),
    /// bmc-sim's own command line, so `simulate --fleet-processes` and
    /// `bench --fleet-processes` start their fleet processes from this
    /// executable (see `bmc_sim::cli`).
    #[command(hide = true)]
    BmcSim(bmc_sim::cli::Args),
}

impl Command {
    /// Whether the command writes to the database `--database-url` names.
    /// `simulate`, `demo` and `bench` make databases of their own.
    fn writes(&self) -> bool {
        match self {
            Command::Serve(_) | Command::Migrate => true,
            Command::Fleet(command) => command.writes(),
            Command::Release(command) => command.writes(),
            Command::Policy(command) => command.writes(),
            Command::User(command) => command.writes(),
            Command::Rollout(command) => command.writes(),
            Command::Rma(command) => command.writes(),
            Command::Simulate(_)
            | Command::Demo(_)
            | Command::Bench(_)
            | Command::DemoScheduler(_)
            | Command::BmcSim(_) => false,
        }
    }
}

/// What every command can use.
#[derive(Debug)]
pub struct Context {
    /// Settings in force.
    pub config: Config,
    /// The command writes to the database (see [`Command::writes`]).
    pub writes: bool,
}

impl Context {
    /// Opens the configured database and applies pending migrations; for a
    /// command that writes, refuses a database on an accelerated clock.
    pub async fn db(&self) -> anyhow::Result<Db> {
        let db = Db::connect_and_migrate(&self.config.database_url, Arc::new(SystemClock))
            .await
            .context("cannot open the database")?;
        if self.writes {
            refuse_accelerated_clock(&db).await?;
        }
        Ok(db)
    }

    /// Who a CLI write acts as, in the audit log: `local-admin:<OS user>`.
    ///
    /// The CLI writes to the database directly, so whoever holds the
    /// database credentials is the local admin; the API's authorization is
    /// not in the path. The `local-admin:` prefix marks every such entry, so
    /// an auditor can tell them from API and UI actions, and a write whose
    /// OS user cannot be named is refused rather than recorded anonymously.
    /// The name comes from the environment: it attributes, it does not
    /// authenticate (the database credentials are the authentication).
    pub fn local_admin(&self) -> Result<String, cmd::BadInput> {
        local_admin_from(|key| std::env::var(key).ok(), uid_name)
    }
}

/// Refuses to write to a database whose timestamps run on an accelerated
/// clock (a running `waveguard demo` marks its database so): this process
/// runs on the real clock, so what it wrote would be dated hours before what
/// the demo writes next, and bakes, windows and approvals would disagree.
/// Carrying the demo's clock instead would need its idle skips too, which
/// only the demo process knows.
pub async fn refuse_accelerated_clock(db: &Db) -> anyhow::Result<()> {
    let mark = db
        .accelerated_clock_mark()
        .await
        .context("cannot read the database's clock mark")?;
    match mark {
        None => Ok(()),
        Some(mark) => Err(cmd::BadInput(format!(
            "this database belongs to a running demo on an accelerated clock ({}x, marked by {}): a command \
             that writes here would record the real time among the demo's times, so it is refused; \
             read-only commands (list, show) work, and the demo's web UI takes every action",
            mark.speedup, mark.by
        ))
        .into()),
    }
}

/// The login name of this process's real uid, from `/proc` and
/// `/etc/passwd` (no libc binding needed); `None` off Linux or for a uid
/// with no passwd entry (e.g. a container run as an arbitrary uid).
fn uid_name() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .to_owned();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        (fields.next()? == uid).then(|| name.to_owned())
    })
}

/// [`Context::local_admin`] over any environment, for tests.
fn local_admin_from(
    env: impl Fn(&str) -> Option<String>,
    uid_name: impl FnOnce() -> Option<String>,
) -> Result<String, cmd::BadInput> {
    // LOGNAME is POSIX's name for the login; USER is what most shells set;
    // a service or CI job often has neither, and then the uid names it.
    let user = ["USER", "LOGNAME"]
        .into_iter()
        .filter_map(&env)
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty())
        .or_else(uid_name)
        .ok_or_else(|| {
            cmd::BadInput(
                "the OS user is unknown (USER and LOGNAME unset, no passwd entry for this uid): CLI writes \
                 are recorded as local-admin:<OS user> and are refused without one"
                    .into(),
            )
        })?;
    // A name that could forge another audit actor (`:`), break a log line or
    // hide in whitespace is refused, not cleaned up.
    let plausible = user.len() <= 64
        && user
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '$'));
    if !plausible {
        return Err(cmd::BadInput(format!(
            "the OS user {user:?} is not a plausible user name (letters, digits, . _ - @ $; at most 64): \
             CLI writes are refused"
        )));
    }
    Ok(format!("local-admin:{user}"))
}

/// Exit status for input the user must fix (bad file, illegal transition).
pub const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let file = match &cli.config {
        Some(path) => match FileConfig::load(path) {
            Ok(file) => file,
            Err(err) => {
                eprintln!("error: {err:#}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        },
        None => FileConfig::default(),
    };
    let overrides = Overrides {
        database_url: cli.database_url.clone(),
        listen: None,
        log_format: cli.log_format,
        log_level: cli.log_level.clone(),
    };
    let config = match Config::merge(file, overrides) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    if let Err(err) = logging::init(config.log_format, &config.log_level) {
        eprintln!("error: {err:#}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let context = Context {
        config,
        writes: cli.command.writes(),
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => cmd::serve::run(args, context).await,
            Command::Migrate => cmd::migrate(&context).await,
            Command::Fleet(command) => cmd::fleet::run(command, &context).await,
            Command::Release(command) => cmd::release::run(command, &context).await,
            Command::Policy(command) => cmd::policy::run(command, &context).await,
            Command::User(command) => cmd::user::run(command, &context).await,
            Command::Rollout(command) => cmd::rollout::run(command, &context).await,
            Command::Rma(command) => cmd::rma::run(command, &context).await,
            Command::Simulate(args) => cmd::simulate::run(args, &context).await,
            Command::Demo(args) => cmd::demo::run(args, &context).await,
            Command::Bench(args) => cmd::bench::run(args, &context).await,
            Command::DemoScheduler(args) => cmd::demo_scheduler::run(args),
            Command::BmcSim(mut args) => {
                args.leading_args = vec!["bmc-sim".into()];
                bmc_sim::cli::run(args).await.map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            if is_bad_input(&err) {
                ExitCode::from(EXIT_BAD_INPUT)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Errors the user causes and can fix get exit status 2, like usage errors.
fn is_bad_input(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<DbError>().is_some_and(DbError::is_caller_error)
            || cause
                .downcast_ref::<orchestrator_db::fleet_file::FleetFileError>()
                .is_some()
            || cause.downcast_ref::<cmd::BadInput>().is_some()
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn local_admin_names_the_os_user_or_refuses() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| (*v).to_owned())
        };
        let no_uid = || None;
        assert_eq!(
            super::local_admin_from(env(&[("USER", "carol")]), no_uid).unwrap(),
            "local-admin:carol"
        );
        assert_eq!(
            super::local_admin_from(env(&[("USER", " "), ("LOGNAME", "dave")]), no_uid).unwrap(),
            "local-admin:dave"
        );
        assert_eq!(
            super::local_admin_from(env(&[]), || Some("root".into())).unwrap(),
            "local-admin:root"
        );
        for refused in [
            &[][..],
            &[("USER", "")][..],
            &[("USER", "eve\nforged")][..],
            &[("USER", "a:b")][..],
        ] {
            let err = super::local_admin_from(env(refused), no_uid).unwrap_err();
            assert!(!err.0.contains("cli:unknown"), "{err}");
        }
        // A forged-looking name in the environment is refused, not replaced
        // by the uid's name.
        assert!(super::local_admin_from(env(&[("USER", "x:y")]), || Some("root".into())).is_err());
    }

    #[test]
    fn every_option_is_documented() {
        super::Cli::command().debug_assert();
        fn check(command: &clap::Command, path: &str) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some() || arg.get_long_help().is_some(),
                    "{path} --{id} has no help"
                );
            }
            for sub in command.get_subcommands() {
                assert!(sub.get_about().is_some(), "{path} {} has no help", sub.get_name());
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&super::Cli::command(), "waveguard");
    }
}
