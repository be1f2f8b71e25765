//! `waveguard user ...`: local users of the web UI and API tokens for
//! automation.
//!
//! Passwords come from a prompt (no echo) or from an environment variable
//! named by `--password-env`, never from a flag, so they stay out of shell
//! history and `ps`. A token is printed once and stored only as a hash.

use std::process::ExitCode;

use anyhow::Context as _;
use orchestrator_types::Role;

use super::BadInput;
use crate::Context;

/// User commands.
#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Create a local user.
    Add {
        /// Login name: letters, digits, '.', '_' or '-'.
        name: String,
        /// viewer (reads), release_manager (releases and rollouts) or admin (users too).
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Full name shown in the UI (defaults to NAME).
        #[arg(long)]
        display_name: Option<String>,
        /// Read the password from this environment variable instead of a prompt.
        #[arg(long, value_name = "VAR")]
        password_env: Option<String>,
        /// Create the user without a password: it can only use API tokens.
        #[arg(long, conflicts_with = "password_env")]
        no_password: bool,
    },
    /// Set a user's password (ends the user's sessions).
    Passwd {
        /// The user whose password changes.
        name: String,
        /// Read the password from this environment variable instead of a prompt.
        #[arg(long, value_name = "VAR")]
        password_env: Option<String>,
    },
    /// Change a user's role, or disable or enable the user (ends the user's sessions).
    Set {
        /// The user to change.
        name: String,
        /// New role: viewer, release_manager or admin.
        #[arg(long)]
        role: Option<String>,
        /// Disable the user: no logins, tokens refused.
        #[arg(long, conflicts_with = "enable")]
        disable: bool,
        /// Enable a disabled user again.
        #[arg(long)]
        enable: bool,
    },
    /// Issue an API token for NAME and print it once (`Authorization: Bearer TOKEN`).
    Token {
        /// The user the token acts as.
        name: String,
        /// What the token is for (e.g. ci, alert-bridge).
        #[arg(long, default_value = "automation")]
        label: String,
    },
    /// Revoke one of a user's API tokens by its id (see `user list --tokens`).
    Revoke {
        /// The token's owner.
        name: String,
        /// The token's id from `user list --tokens`.
        token_id: i64,
    },
    /// List users (and their tokens' ids, labels and last use).
    List {
        /// Also list each user's API tokens.
        #[arg(long)]
        tokens: bool,
    },
}

impl UserCommand {
    /// Whether the command writes to the database (a command not listed as
    /// a read writes, so a new command is refused on a demo's database until
    /// someone says it only reads).
    pub fn writes(&self) -> bool {
        !matches!(self, Self::List { .. })
    }
}

fn parse_role(text: &str) -> anyhow::Result<Role> {
    text.parse::<Role>()
        .map_err(|_| BadInput(format!("unknown role {text:?}: use viewer, release_manager or admin")).into())
}

fn read_password(env_var: Option<&str>) -> anyhow::Result<String> {
    let password = match env_var {
        Some(var) => std::env::var(var).map_err(|_| BadInput(format!("environment variable {var} is not set")))?,
        None => {
            let first =
                rpassword::prompt_password("Password: ").context("cannot read the password from the terminal")?;
            let second = rpassword::prompt_password("Again: ").context("cannot read the password from the terminal")?;
            if first != second {
                return Err(BadInput("the passwords differ".into()).into());
            }
            first
        }
    };
    if password.chars().count() < 8 {
        return Err(BadInput("use a password of at least 8 characters".into()).into());
    }
    Ok(password)
}

/// Runs a user command.
pub async fn run(command: UserCommand, context: &Context) -> anyhow::Result<ExitCode> {
    let db = context.db().await?;
    // Reads need no OS user; every write asks for one (local-admin mode).
    let actor = || context.local_admin();
    match command {
        UserCommand::Add {
            name,
            role,
            display_name,
            password_env,
            no_password,
        } => {
            let role = parse_role(&role)?;
            let hash = if no_password {
                None
            } else {
                let password = read_password(password_env.as_deref())?;
                Some(web::auth::hash_password(&password).context("cannot hash the password")?)
            };
            let user = db
                .add_user(
                    &name,
                    display_name.as_deref().unwrap_or(&name),
                    role,
                    hash.as_deref(),
                    &actor()?,
                )
                .await?;
            println!("added {} ({})", user.username, user.role);
        }
        UserCommand::Passwd { name, password_env } => {
            let password = read_password(password_env.as_deref())?;
            let hash = web::auth::hash_password(&password).context("cannot hash the password")?;
            db.update_user(&name, Some(&hash), None, None, &actor()?).await?;
            println!("password of {name} changed; its sessions are ended");
        }
        UserCommand::Set {
            name,
            role,
            disable,
            enable,
        } => {
            let role = role.as_deref().map(parse_role).transpose()?;
            let disabled = if disable {
                Some(true)
            } else if enable {
                Some(false)
            } else {
                None
            };
            if role.is_none() && disabled.is_none() {
                return Err(BadInput("nothing to change: give --role, --disable or --enable".into()).into());
            }
            let user = db.update_user(&name, None, role, disabled, &actor()?).await?;
            println!(
                "{} is {}{}",
                user.username,
                user.role,
                if user.disabled { " (disabled)" } else { "" }
            );
        }
        UserCommand::Token { name, label } => {
            let token = web::auth::new_api_token();
            let stored = db
                .add_api_token(&name, &label, &web::auth::token_hash(&token), &actor()?)
                .await?;
            eprintln!(
                "API token {} for {name} ({label}); it is shown only now, store it safely:",
                stored.id
            );
            println!("{token}");
        }
        UserCommand::Revoke { name, token_id } => {
            db.revoke_api_token(&name, token_id, &actor()?).await?;
            println!("revoked token {token_id} of {name}");
        }
        UserCommand::List { tokens } => {
            for user in db.list_users().await? {
                println!(
                    "{:<24} {:<16} {}{}",
                    user.username,
                    user.role,
                    user.display_name,
                    if user.disabled { " (disabled)" } else { "" }
                );
                if tokens {
                    for token in db.api_tokens(&user.username).await? {
                        println!(
                            "    token {:<6} {:<20} created {} last used {}{}",
                            token.id,
                            token.name,
                            token.created_at.format("%Y-%m-%d %H:%M"),
                            token
                                .last_used_at
                                .map_or_else(|| "never".to_owned(), |t| t.format("%Y-%m-%d %H:%M").to_string()),
                            if token.revoked { " (revoked)" } else { "" }
                        );
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
