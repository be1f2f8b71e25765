//! Choosing a wave's nodes under its membership caps.
//!
//! First a greedy pass over the stratified order. When the greedy pass gets
//! stuck short of the wave's size (racks and NVLink domains that cross each
//! other can trap it, e.g. a six-cycle of rack/domain pairs), the choice is
//! completed as a maximum flow: source → cluster → rack → node → NVLink
//! domain → sink, with each stratum's cap as the capacity of its edge,
//! starting from the greedy choice and adding augmenting paths (which may
//! swap greedy picks for others). Racks and domains are keyed within their
//! cluster, so the caps form two laminar families; the fractional choice
//! "every node with weight size/pool" meets every cap (each cap is at least
//! the stratum's fair share), and the intersection of two laminar matroids
//! has an integral polytope, so an exact choice of `size` nodes within the
//! caps always exists and the flow finds it. The in-order fill that records
//! [`CapRelaxation`]s is kept as a last resort for inputs that break that
//! argument, never silently.

use std::collections::{BTreeMap, VecDeque};

use crate::input::NodeSnapshot;
use crate::plan::{CapDimension, CapRelaxation, WaveCaps};

/// Capacity standing for "no cap in this dimension".
const UNCAPPED: usize = usize::MAX / 4;

type Stratum = (CapDimension, String);

/// The cap strata a node belongs to. A node with no NVLink domain shares
/// no fabric, so it counts against no domain cap.
pub(crate) fn cap_strata(node: &NodeSnapshot) -> Vec<(CapDimension, String)> {
    let mut strata = vec![
        (CapDimension::Cluster, node.cluster.clone()),
        (CapDimension::Rack, format!("{}/{}", node.cluster, node.rack)),
    ];
    if !node.nvlink_domain.is_empty() {
        strata.push((
            CapDimension::NvlinkDomain,
            format!("{}/{}", node.cluster, node.nvlink_domain),
        ));
    }
    strata
}

/// Takes `size` of `order` (indices into `nodes`) within `caps`; returns the
/// choice in `order`'s order and any cap that had to be exceeded.
pub(crate) fn select_with_caps(
    order: &[usize],
    size: usize,
    nodes: &[&NodeSnapshot],
    caps: &WaveCaps,
    cluster_sizes: &BTreeMap<&str, usize>,
) -> (Vec<usize>, Vec<CapRelaxation>) {
    let strata: Vec<Vec<Stratum>> = order.iter().map(|&i| cap_strata(nodes[i])).collect();
    let mut pool: BTreeMap<&Stratum, usize> = BTreeMap::new();
    for s in strata.iter().flatten() {
        *pool.entry(s).or_default() += 1;
    }
    let mut limits: BTreeMap<&Stratum, usize> = BTreeMap::new();
    for (pos, &i) in order.iter().enumerate() {
        let cluster_nodes = cluster_sizes.get(nodes[i].cluster.as_str()).copied().unwrap_or(0);
        for s in &strata[pos] {
            let limit = caps.limit(s.0, pool.get(s).copied().unwrap_or(0), cluster_nodes);
            limits.insert(s, limit.unwrap_or(UNCAPPED));
        }
    }

    // Greedy pass.
    let mut taken: BTreeMap<&Stratum, usize> = BTreeMap::new();
    let mut chosen = vec![false; order.len()];
    let mut count = 0;
    for pos in 0..order.len() {
        if count == size {
            break;
        }
        if strata[pos]
            .iter()
            .all(|s| taken.get(s).copied().unwrap_or(0) < limits[s])
        {
            for s in &strata[pos] {
                *taken.entry(s).or_default() += 1;
            }
            chosen[pos] = true;
            count += 1;
        }
    }
    if count < size {
        count = augment(&strata, &limits, &mut chosen, size);
    }

    let mut relaxations = Vec::new();
    if count < size {
        for slot in chosen.iter_mut().filter(|c| !**c) {
            if count == size {
                break;
            }
            *slot = true;
            count += 1;
        }
        let mut planned: BTreeMap<&Stratum, usize> = BTreeMap::new();
        for pos in (0..order.len()).filter(|&p| chosen[p]) {
            for s in &strata[pos] {
                *planned.entry(s).or_default() += 1;
            }
        }
        for (s, n) in planned {
            if n > limits[s] {
                relaxations.push(CapRelaxation {
                    dimension: s.0,
                    stratum: s.1.clone(),
                    limit: limits[s],
                    planned: n,
                });
            }
        }
    }
    let selected = (0..order.len()).filter(|&p| chosen[p]).map(|p| order[p]).collect();
    (selected, relaxations)
}

#[derive(Debug)]
struct Edge {
    to: usize,
    cap: usize,
    flow: isize,
}

/// A small residual graph; edge `e ^ 1` is the reverse of edge `e`.
#[derive(Debug, Default)]
struct Graph {
    adj: Vec<Vec<usize>>,
    edges: Vec<Edge>,
}

impl Graph {
    fn vertex(&mut self) -> usize {
        self.adj.push(Vec::new());
        self.adj.len() - 1
    }

    fn edge(&mut self, from: usize, to: usize, cap: usize) -> usize {
        let id = self.edges.len();
        self.edges.push(Edge { to, cap, flow: 0 });
        self.edges.push(Edge {
            to: from,
            cap: 0,
            flow: 0,
        });
        self.adj[from].push(id);
        self.adj[to].push(id + 1);
        id
    }

    fn residual(&self, e: usize) -> isize {
        // Capacities are bounded by UNCAPPED, which fits an isize.
        self.edges[e].cap as isize - self.edges[e].flow
    }

    fn push(&mut self, e: usize) {
        self.edges[e].flow += 1;
        self.edges[e ^ 1].flow -= 1;
    }

    /// One unit along a shortest augmenting path, if any.
    fn augment_once(&mut self, source: usize, sink: usize) -> bool {
        let mut via: Vec<Option<usize>> = vec![None; self.adj.len()];
        let mut seen = vec![false; self.adj.len()];
        seen[source] = true;
        let mut queue = VecDeque::from([source]);
        while let Some(v) = queue.pop_front() {
            if v == sink {
                break;
            }
            for &e in &self.adj[v] {
                let to = self.edges[e].to;
                if !seen[to] && self.residual(e) > 0 {
                    seen[to] = true;
                    via[to] = Some(e);
                    queue.push_back(to);
                }
            }
        }
        if !seen[sink] {
            return false;
        }
        let mut v = sink;
        while let Some(e) = via[v] {
            self.push(e);
            v = self.edges[e ^ 1].to;
        }
        true
    }
}

/// Completes the greedy choice by maximum flow; returns the new count.
fn augment(strata: &[Vec<Stratum>], limits: &BTreeMap<&Stratum, usize>, chosen: &mut [bool], size: usize) -> usize {
    let mut g = Graph::default();
    let source = g.vertex();
    let sink = g.vertex();
    let cap = |s: &Stratum| limits.get(s).copied().unwrap_or(UNCAPPED);
    // Each stratum's vertex and the edge that carries its cap.
    let mut clusters: BTreeMap<&Stratum, (usize, usize)> = BTreeMap::new();
    let mut racks: BTreeMap<&Stratum, (usize, usize)> = BTreeMap::new();
    let mut domains: BTreeMap<&Stratum, (usize, usize)> = BTreeMap::new();
    // Per candidate: the edges of its path from source to sink.
    let mut paths: Vec<Option<Vec<usize>>> = Vec::with_capacity(strata.len());
    for pos_strata in strata {
        let find = |dim: CapDimension| pos_strata.iter().find(|s| s.0 == dim);
        let (Some(cluster), Some(rack)) = (find(CapDimension::Cluster), find(CapDimension::Rack)) else {
            paths.push(None);
            continue;
        };
        let (cv, c_edge) = *clusters.entry(cluster).or_insert_with(|| {
            let v = g.vertex();
            (v, g.edge(source, v, cap(cluster)))
        });
        let (rv, r_edge) = *racks.entry(rack).or_insert_with(|| {
            let v = g.vertex();
            (v, g.edge(cv, v, cap(rack)))
        });
        let node = g.vertex();
        let mut path = vec![c_edge, r_edge, g.edge(rv, node, 1)];
        match find(CapDimension::NvlinkDomain) {
            Some(domain) => {
                let (dv, d_edge) = *domains.entry(domain).or_insert_with(|| {
                    let v = g.vertex();
                    (v, g.edge(v, sink, cap(domain)))
                });
                path.push(g.edge(node, dv, 1));
                path.push(d_edge);
            }
            None => path.push(g.edge(node, sink, 1)),
        }
        paths.push(Some(path));
    }
    // Start from the greedy choice, which is within every cap.
    let mut count = 0;
    for (pos, path) in paths.iter().enumerate() {
        if let (true, Some(path)) = (chosen[pos], path) {
            for &e in path {
                g.push(e);
            }
            count += 1;
        }
    }
    while count < size && g.augment_once(source, sink) {
        count += 1;
    }
    for (pos, path) in paths.iter().enumerate() {
        // The third edge of a path enters the candidate's own vertex.
        chosen[pos] = path.as_ref().is_some_and(|p| g.edges[p[2]].flow > 0);
    }
    chosen.iter().filter(|&&c| c).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::NodeHealth;
    use orchestrator_types::{NodeId, NodeState};

    fn node(id: i64, rack: &str, domain: &str) -> NodeSnapshot {
        NodeSnapshot {
            id: NodeId(id),
            name: format!("n{id}"),
            platform: "p".into(),
            region: "r".into(),
            cluster: "c".into(),
            rack: rack.into(),
            nvlink_domain: domain.into(),
            labels: Default::default(),
            state: NodeState::Active,
            health: NodeHealth::ok(),
            components: Vec::new(),
        }
    }

    fn caps(wave_size: usize, pool: usize) -> WaveCaps {
        WaveCaps {
            wave_size,
            pool,
            per_rack: Some(1),
            per_nvlink_domain: Some(1),
            per_cluster_percent: None,
        }
    }

    #[test]
    fn flow_completes_what_greedy_cannot() {
        // Six-cycle; the order starts with A-X then C-Z, trapping the greedy
        // pass at two.
        let owned = [
            node(1, "A", "X"),
            node(6, "C", "Z"),
            node(2, "A", "Y"),
            node(3, "B", "X"),
            node(4, "B", "Z"),
            node(5, "C", "Y"),
        ];
        let nodes: Vec<&NodeSnapshot> = owned.iter().collect();
        let order: Vec<usize> = (0..6).collect();
        let sizes = BTreeMap::from([("c", 6)]);
        let (selected, relaxations) = select_with_caps(&order, 3, &nodes, &caps(3, 6), &sizes);
        assert!(relaxations.is_empty());
        assert_eq!(selected.len(), 3);
        let racks: std::collections::BTreeSet<_> = selected.iter().map(|&i| &nodes[i].rack).collect();
        let domains: std::collections::BTreeSet<_> = selected.iter().map(|&i| &nodes[i].nvlink_domain).collect();
        assert_eq!((racks.len(), domains.len()), (3, 3));
    }

    #[test]
    fn impossible_caps_are_exceeded_visibly() {
        // Caps computed for a much larger pool (fair share 0, so the policy's
        // 1 per rack applies) but only two racks here: three nodes cannot fit.
        let owned = [node(1, "A", ""), node(2, "A", ""), node(3, "B", ""), node(4, "B", "")];
        let nodes: Vec<&NodeSnapshot> = owned.iter().collect();
        let order: Vec<usize> = (0..4).collect();
        let sizes = BTreeMap::from([("c", 4)]);
        let (selected, relaxations) = select_with_caps(&order, 3, &nodes, &caps(1, 1000), &sizes);
        assert_eq!(selected, vec![0, 1, 2]);
        assert_eq!(
            relaxations,
            vec![CapRelaxation {
                dimension: CapDimension::Rack,
                stratum: "c/A".into(),
                limit: 1,
                planned: 2,
            }]
        );
    }
}
