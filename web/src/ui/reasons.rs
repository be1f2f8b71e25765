//! Plain-language reasons: an audit entry, a release's blocked reason or a
//! rollout's state reason as a sentence a release manager reads, with the
//! full evidence one click away (a collapsed block on the same page) and
//! subjects named and linked (a node by its name, never its id).

use std::collections::{BTreeMap, BTreeSet};

use minijinja::{Value, context};
use orchestrator_db::Db;
use orchestrator_db::health::LookAuditDetails;
use orchestrator_db::model::AuditEntry;
use orchestrator_types::{NodeId, Outcome};
use serde_json::Value as Json;

use super::UiError;

/// What the engine appends before a blocked release's evidence (see the
/// executor's `block_release`): the sentence is before it, the JSON after.
const EVIDENCE_MARKER: &str = "; evidence: ";

/// A stored reason split into the sentence and the evidence behind it.
pub(crate) fn split(reason: &str) -> (String, Option<String>) {
    match reason.split_once(EVIDENCE_MARKER) {
        Some((sentence, evidence)) => (sentence.trim().to_owned(), Some(pretty(evidence))),
        None => (reason.trim().to_owned(), None),
    }
}

/// The sentence of a stored reason, without its evidence.
pub(crate) fn plain(reason: &str) -> String {
    split(reason).0
}

/// A reason as a template value: `text` and, when there is any, `evidence`.
pub(crate) fn reason_value(reason: Option<&str>) -> Value {
    match reason {
        None => Value::from(()),
        Some(reason) => {
            let (text, evidence) = split(reason);
            context! { text, evidence }
        }
    }
}

/// JSON text indented for reading; text that is not JSON (a truncated
/// evidence blob ends in `…`) is returned as it is.
fn pretty(text: &str) -> String {
    serde_json::from_str::<Json>(text)
        .ok()
        .and_then(|json| serde_json::to_string_pretty(&json).ok())
        .unwrap_or_else(|| text.to_owned())
}

/// Audit actions that are decisions (a promotion, a halt, an approval, a
/// qualification change, a quarantine) rather than progress; the log shows
/// them marked so they stand out among step moves.
fn is_decision(entry: &AuditEntry) -> bool {
    match entry.action.as_str() {
        "wave.approve"
        | "release.transition"
        | "release.block"
        | "release.unblock"
        | "release.fleet_proven"
        | "node.state"
        | "rollout.start"
        | "alert.action"
        | "rma.transition" => true,
        "wave.transition" => matches!(
            field(&entry.details, "to").as_deref(),
            Some("promoted" | "halted" | "awaiting_approval" | "rolled_back")
        ),
        // Every look that is not a pass is shown as a decision, as before the typed read.
        "health.look" => LookAuditDetails::from_audit(&entry.details).is_some_and(|look| look.outcome != Outcome::Pass),
        action => action.starts_with("rollout."),
    }
}

fn field(details: &Json, key: &str) -> Option<String> {
    match details.get(key)? {
        Json::Null => None,
        Json::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn node_id_of(details: &Json) -> Option<NodeId> {
    details.get("node_id").and_then(Json::as_i64).map(NodeId)
}

/// One entry as a sentence, with `node` standing for the node it concerns.
fn sentence(entry: &AuditEntry, node: Option<&str>) -> String {
    let d = &entry.details;
    let f = |key: &str| field(d, key).unwrap_or_default();
    let node = node.map_or_else(|| "a node".to_owned(), str::to_owned);
    let with_reason = |text: String| match field(d, "reason") {
        Some(reason) if !reason.is_empty() => format!("{text}: {}", plain(&reason)),
        _ => text,
    };
    match entry.action.as_str() {
        "step.transition" => {
            let mut text = format!("{} step on {node}: {} → {}", f("purpose"), f("from"), f("to"));
            if let Some(error) = field(d, "error") {
                text.push_str(&format!(" ({error})"));
            }
            text
        }
        "step.retry" => format!("{node}: BMC error, the step will be retried"),
        "step.rollback_planned" => format!("rollback planned on {node}: {} → {}", f("from"), f("to")),
        "wave.transition" => {
            let mut text = format!("wave {}: {} → {}", f("wave"), f("from"), f("to"));
            if let Some(decision) = field(d, "decision") {
                text.push_str(&format!(", decision: {decision}"));
            }
            with_reason(text)
        }
        "wave.approve" => {
            let mut text = format!("{} approved wave {}", entry.actor, f("wave"));
            if let Some(comment) = field(d, "comment") {
                text.push_str(&format!(": “{comment}”"));
            }
            text
        }
        "health.look" => match LookAuditDetails::from_audit(d) {
            Some(look) => {
                let text = format!(
                    "gate {} look {} of {}: {}",
                    look.gate, look.look, look.planned, look.outcome
                );
                match super::verdicts::look_phrase(&look.verdict) {
                    Some(numbers) => format!("{text} ({numbers})"),
                    None => text,
                }
            }
            None => format!("gate {} look {} of {}: recorded", f("gate"), f("look"), f("planned")),
        },
        "rollout.start" => format!("rollout started under policy {}", f("policy")),
        "release.add" => format!("release {} {} registered", f("component_kind"), f("version")),
        "release.gate_result" => format!(
            "qualification gate {} {}",
            f("gate"),
            if d.get("passed").and_then(Json::as_bool) == Some(true) {
                "passed"
            } else {
                "failed"
            }
        ),
        "release.transition" | "release.block" | "release.unblock" => {
            with_reason(format!("qualification {} → {}", f("from"), f("to")))
        }
        "node.state" => with_reason(format!("{node}: {} → {}", f("from"), f("to"))),
        "node.import" => format!(
            "nodes imported: {} created, {} updated, {} unchanged",
            f("created"),
            f("updated"),
            f("unchanged")
        ),
        "rma.open" => format!(
            "RMA case opened for GPU {} on {} ({}, {})",
            f("serial"),
            f("node"),
            f("rule"),
            f("failure_mode").replace('_', " ")
        ),
        "rma.transition" => {
            let text = format!(
                "RMA step {}: {} → {}",
                f("event").replace('_', " "),
                f("from").replace('_', " "),
                f("to").replace('_', " ")
            );
            match field(d, "detail") {
                Some(detail) if !detail.is_empty() => format!("{text}: {detail}"),
                _ => text,
            }
        }
        "user.login" => format!("{} logged in", entry.subject_id),
        "user.logout" => format!("{} logged out", entry.subject_id),
        "user.token.add" => format!("API token “{}” created for {}", f("name"), entry.subject_id),
        "user.token.revoke" => format!("API token #{} of {} revoked", f("token_id"), entry.subject_id),
        action if action.starts_with("rollout.") => with_reason(format!("rollout {} → {}", f("from"), f("to"))),
        action => action.replace(['.', '_'], " "),
    }
}

/// Where an entry's subject lives in the UI, and what to call it.
fn subject(entry: &AuditEntry, node: Option<&str>) -> (String, Option<String>) {
    let id = entry.subject_id.as_str();
    let d = &entry.details;
    let rollout = field(d, "rollout_id").or_else(|| field(d, "rollout"));
    match entry.subject_type.as_str() {
        "node" => (id.to_owned(), Some(format!("/nodes/{}", crate::url::urlencode(id)))),
        "release" => (format!("release #{id}"), Some(format!("/releases/{id}"))),
        "rollout" => (format!("rollout #{id}"), Some(format!("/rollouts/{id}"))),
        "rma_case" => (
            format!("RMA case {id}"),
            Some(format!("/rma/{}", crate::url::urlencode(id))),
        ),
        "wave" => {
            let name = field(d, "wave").map_or_else(|| format!("wave #{id}"), |w| format!("wave {w}"));
            match rollout {
                Some(r) => (format!("{name} of rollout #{r}"), Some(format!("/rollouts/{r}"))),
                None => (name, None),
            }
        }
        "step" => match (node, rollout) {
            (Some(node), Some(r)) => (
                format!("{node} in rollout #{r}"),
                Some(format!("/rollouts/{r}?node={}", crate::url::urlencode(node))),
            ),
            (Some(node), None) => (node.to_owned(), Some(format!("/nodes/{}", crate::url::urlencode(node)))),
            (None, _) => (format!("step #{id}"), None),
        },
        other => (format!("{other} {id}"), None),
    }
}

/// Audit entries as rows: the decision flag, the sentence, the linked
/// subject, the details as named fields (node ids as linked names) and the
/// raw JSON, collapsed. Node names are read in one query for the page.
pub(crate) async fn audit_rows(db: &Db, entries: &[AuditEntry]) -> Result<Vec<Value>, UiError> {
    let ids: BTreeSet<NodeId> = entries.iter().filter_map(|e| node_id_of(&e.details)).collect();
    let names = db.node_names(&ids.into_iter().collect::<Vec<_>>()).await?;
    Ok(entries.iter().map(|entry| audit_row(entry, &names)).collect())
}

fn audit_row(entry: &AuditEntry, names: &BTreeMap<NodeId, String>) -> Value {
    let node = match node_id_of(&entry.details) {
        Some(id) => names.get(&id).map(String::as_str),
        None if entry.subject_type == "node" => Some(entry.subject_id.as_str()),
        None => None,
    };
    let (subject_label, subject_link) = subject(entry, node);
    let fields: Vec<Value> = entry
        .details
        .as_object()
        .map(|obj| {
            obj.iter()
                .filter(|(_, value)| !value.is_null())
                .filter_map(|(key, value)| {
                    if key == "node_id"
                        && let Some(name) = node
                    {
                        return Some(context! {
                            key => "node", value => name,
                            link => format!("/nodes/{}", crate::url::urlencode(name)),
                        });
                    }
                    let text = match value {
                        Json::String(s) => plain(s),
                        Json::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => items
                            .iter()
                            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                            .collect::<Vec<_>>()
                            .join(", "),
                        // Nested records stay in the full details below,
                        // never as an escaped blob in the list.
                        Json::Object(_) | Json::Array(_) => return None,
                        other => other.to_string(),
                    };
                    Some(context! { key, value => text, link => () })
                })
                .collect()
        })
        .unwrap_or_default();
    let raw = serde_json::to_string_pretty(&entry.details).unwrap_or_default();
    context! {
        id => entry.id, at => entry.at.to_rfc3339(), actor => entry.actor.clone(), action => entry.action.clone(),
        decision => is_decision(entry), sentence => sentence(entry, node),
        subject_label, subject_link, fields, raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: &str, subject_type: &str, subject_id: &str, details: Json) -> AuditEntry {
        AuditEntry {
            id: 1,
            at: chrono::Utc::now(),
            actor: "engine".into(),
            action: action.into(),
            subject_type: subject_type.into(),
            subject_id: subject_id.into(),
            details,
        }
    }

    #[test]
    fn blocked_reason_splits_sentence_from_evidence() {
        let reason = r#"rollout 2 wave canary: health verdict failed: xid rate 3.1x control; evidence: {"alpha":0.05}"#;
        let (text, evidence) = split(reason);
        assert_eq!(
            text,
            "rollout 2 wave canary: health verdict failed: xid rate 3.1x control"
        );
        assert!(evidence.unwrap().contains("\"alpha\": 0.05"));
        assert_eq!(split("recalled by vendor"), ("recalled by vendor".into(), None));
    }

    #[test]
    fn steps_name_their_node_and_link_it() {
        let e = entry(
            "step.transition",
            "step",
            "9",
            serde_json::json!({ "node_id": 7, "rollout_id": 3, "from": "flashing", "to": "failed", "purpose": "update" }),
        );
        let names = BTreeMap::from([(NodeId(7), "gpu-node-007".to_owned())]);
        let row = audit_row(&e, &names);
        assert_eq!(
            row.get_attr("sentence").unwrap().to_string(),
            "update step on gpu-node-007: flashing → failed"
        );
        assert_eq!(
            row.get_attr("subject_link").unwrap().to_string(),
            "/rollouts/3?node=gpu-node-007"
        );
        let fields = row.get_attr("fields").unwrap();
        let rendered = format!("{fields:?}");
        assert!(rendered.contains("/nodes/gpu-node-007"), "{rendered}");
        assert!(!rendered.contains("node_id"), "{rendered}");
    }

    #[test]
    fn rma_steps_read_as_sentences_and_link_their_case() {
        let e = entry(
            "rma.transition",
            "rma_case",
            "RMA-SN-1-fallen_off_bus-1",
            serde_json::json!({ "from": "submitted", "to": "rejected", "event": "vendor_rejected",
                "actor": "rita", "at": "2026-12-02T12:00:00Z", "detail": "diagnostic passed" }),
        );
        let row = audit_row(&e, &BTreeMap::new());
        assert_eq!(
            row.get_attr("sentence").unwrap().to_string(),
            "RMA step vendor rejected: submitted → rejected: diagnostic passed"
        );
        assert_eq!(
            row.get_attr("subject_link").unwrap().to_string(),
            "/rma/RMA-SN-1-fallen_off_bus-1"
        );
    }

    #[test]
    fn decisions_are_marked() {
        let cases = [
            ("wave.approve", serde_json::json!({}), true),
            ("wave.transition", serde_json::json!({ "to": "halted" }), true),
            ("wave.transition", serde_json::json!({ "to": "baking" }), false),
            ("step.transition", serde_json::json!({ "to": "failed" }), false),
            ("rollout.paused", serde_json::json!({}), true),
            ("user.login", serde_json::json!({}), false),
        ];
        for (action, details, expected) in cases {
            assert_eq!(is_decision(&entry(action, "x", "1", details)), expected, "{action}");
        }
    }
}
