//! `waveguard user` as an operator runs it: real processes against a real
//! SQLite file; the token it prints authenticates against the web app.

use std::process::{Command, Output};

use orchestrator_types::Role;

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");

fn waveguard(db_url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("WAVEGUARD_DATABASE_URL", db_url)
        .env_remove("WAVEGUARD_CONFIG");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("waveguard runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn users_and_tokens_from_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("w.db").display());
    let secret = "a long enough password";

    let out = waveguard(
        &url,
        &[
            "user",
            "add",
            "rita",
            "--role",
            "release_manager",
            "--password-env",
            "RITA_PW",
        ],
        &[("RITA_PW", secret)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains(secret) && !text(&out.stderr).contains(secret));

    // Input the user must fix exits 2.
    for (args, env) in [
        (vec!["user", "add", "bob", "--role", "boss", "--no-password"], vec![]),
        (vec!["user", "add", "bob", "--password-env", "UNSET_PW_VAR"], vec![]),
        (
            vec!["user", "add", "bob", "--password-env", "SHORT"],
            vec![("SHORT", "short")],
        ),
        (vec!["user", "add", "rita", "--no-password"], vec![]),
        (vec!["user", "token", "nobody"], vec![]),
    ] {
        let out = waveguard(&url, &args, &env);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }

    let out = waveguard(&url, &["user", "token", "rita", "--label", "ci"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token = text(&out.stdout).trim().to_owned();
    assert!(token.starts_with("wg_") && token.len() == 67, "{token}");

    let out = waveguard(&url, &["user", "list", "--tokens"], &[]);
    let listing = text(&out.stdout);
    assert!(listing.contains("rita") && listing.contains("release_manager") && listing.contains("ci"));
    assert!(!listing.contains(&token), "the token is shown only once");

    // What was stored: an argon2 hash that verifies, a token that authenticates.
    let db = orchestrator_db::Db::connect_and_migrate(&url, std::sync::Arc::new(orchestrator_types::SystemClock))
        .await
        .expect("db");
    let (user, hash) = db.user_with_password_hash("rita").await.expect("rita");
    assert_eq!(user.role, Role::ReleaseManager);
    let hash = hash.expect("a password hash");
    assert!(hash.starts_with("$argon2id$") && web::auth::verify_password(secret, &hash));
    let found = db
        .user_by_api_token(&web::auth::token_hash(&token))
        .await
        .expect("lookup");
    assert_eq!(found.map(|u| u.username).as_deref(), Some("rita"));

    // Disabling the user kills the token.
    let out = waveguard(&url, &["user", "set", "rita", "--disable"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        db.user_by_api_token(&web::auth::token_hash(&token))
            .await
            .expect("lookup")
            .is_none()
    );
}
