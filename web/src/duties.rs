//! Separation of duties, by configuration: who may qualify a release,
//! whether a second person must do it, and whether rollouts may run under
//! an inline policy instead of a reviewed one from git. Checked by the API
//! and the UI through the same functions, so neither is a way around it.

use std::collections::BTreeSet;

use orchestrator_db::Db;
use orchestrator_types::{QualificationState, ReleaseId};

use crate::error::ApiError;

/// The rules. [`Duties::default`] is permissive (one person may do
/// everything), for embedding and tests; `waveguard serve` starts from
/// [`Duties::strict`] and an admin relaxes it with flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duties {
    /// Users who may move a release to `qualified`; `None` lets any
    /// release manager.
    pub qualifiers: Option<BTreeSet<String>>,
    /// The user who registered a release may not also qualify it.
    pub second_person_qualifies: bool,
    /// Rollouts may use `policy_yaml` (an unreviewed inline policy).
    pub allow_inline_policies: bool,
}

impl Default for Duties {
    fn default() -> Self {
        Self {
            qualifiers: None,
            second_person_qualifies: false,
            allow_inline_policies: true,
        }
    }
}

impl Duties {
    /// What `serve` enforces unless told otherwise: a second person
    /// qualifies, and rollouts use reviewed policies from git only.
    pub fn strict() -> Self {
        Self {
            qualifiers: None,
            second_person_qualifies: true,
            allow_inline_policies: false,
        }
    }

    /// Refuses a transition to `qualified` that the rules do not allow
    /// `actor` to make (403 naming the rule).
    pub(crate) async fn check_transition(
        &self,
        db: &Db,
        release: ReleaseId,
        to: QualificationState,
        actor: &str,
    ) -> Result<(), ApiError> {
        if to != QualificationState::Qualified {
            return Ok(());
        }
        if let Some(qualifiers) = &self.qualifiers
            && !qualifiers.contains(actor)
        {
            return Err(ApiError::Forbidden(format!(
                "{actor} may not qualify releases (the controller's qualifiers are configured)"
            )));
        }
        if self.second_person_qualifies {
            let release = db.release(release).await?;
            if release.created_by == actor {
                return Err(ApiError::Forbidden(format!(
                    "{actor} registered this release; a second person must qualify it"
                )));
            }
        }
        Ok(())
    }

    /// Refuses an inline policy unless an admin enabled them.
    pub(crate) fn check_inline_policy(&self) -> Result<(), ApiError> {
        if self.allow_inline_policies {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "inline policies are disabled on this controller: start the rollout with a reviewed policy \
                 (`policy`), or have an admin start serve with --allow-inline-policies"
                    .into(),
            ))
        }
    }
}
