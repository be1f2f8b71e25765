//! Stratified ordering: lay nodes out so that every prefix of the order is
//! spread across platforms, clusters, racks and NVLink domains.

use std::collections::BTreeMap;

use crate::input::{NodeSnapshot, PLATFORM_LABEL};
use crate::rng::SplitMix64;

/// A label nodes are spread across.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dim {
    Platform,
    Cluster,
    /// Keyed `cluster/rack`: rack names repeat across clusters.
    Rack,
    /// Keyed `cluster/domain`.
    NvlinkDomain,
    /// Any other label (`region`, custom ones).
    Label(String),
}

/// Labels every wave is spread across, whatever its `stratify_by` says.
const DEFAULT_DIMS: [&str; 5] = [PLATFORM_LABEL, "region", "cluster", "rack", "nvlink_domain"];

impl Dim {
    fn from_label(name: &str) -> Dim {
        match name {
            PLATFORM_LABEL | "sku" => Dim::Platform,
            "cluster" => Dim::Cluster,
            "rack" => Dim::Rack,
            "nvlink_domain" => Dim::NvlinkDomain,
            other => Dim::Label(other.to_owned()),
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            Dim::Platform => PLATFORM_LABEL,
            Dim::Cluster => "cluster",
            Dim::Rack => "rack",
            Dim::NvlinkDomain => "nvlink_domain",
            Dim::Label(name) => name,
        }
    }

    pub(crate) fn key(&self, node: &NodeSnapshot) -> String {
        match self {
            Dim::Platform => node.platform.clone(),
            Dim::Cluster => node.cluster.clone(),
            Dim::Rack => format!("{}/{}", node.cluster, node.rack),
            Dim::NvlinkDomain => format!("{}/{}", node.cluster, node.nvlink_domain),
            Dim::Label(name) => node.label(name).unwrap_or_default().to_owned(),
        }
    }
}

/// The dimensions to spread `candidates` across: the wave's `stratify_by`
/// plus the defaults, coarsest first (fewest distinct values among the
/// candidates; ties keep the listed order). Coarse first means the order
/// covers every platform and cluster before it covers every rack.
pub(crate) fn choose_dims(stratify_by: &[String], nodes: &[&NodeSnapshot]) -> Vec<Dim> {
    let mut dims: Vec<Dim> = Vec::new();
    for name in stratify_by.iter().map(String::as_str).chain(DEFAULT_DIMS) {
        let dim = Dim::from_label(name);
        if !dims.contains(&dim) {
            dims.push(dim);
        }
    }
    let mut counted: Vec<(usize, Dim)> = dims
        .into_iter()
        .map(|dim| {
            let distinct: std::collections::BTreeSet<String> = nodes.iter().map(|n| dim.key(n)).collect();
            (distinct.len(), dim)
        })
        .collect();
    // Stable: equal counts keep their listed order.
    counted.sort_by_key(|(count, _)| *count);
    counted.into_iter().map(|(_, dim)| dim).collect()
}

/// Orders `items` (indices into `nodes`, given in a canonical order) so
/// that every prefix is spread across `dims`.
///
/// At each level the items are grouped by the dimension's value; each group
/// is ordered recursively by the remaining dimensions; then the groups are
/// merged: first one item of every group (groups in a seeded random order),
/// so a short prefix such as a canary touches as many strata as it can;
/// after that items take positions `(j + u_g) / n_g` (item `j` of group `g`
/// with `n_g` items and a seeded offset `u_g` in [0, 1)), which interleaves
/// the groups in proportion to their sizes, like systematic sampling.
pub(crate) fn stratified_order(
    items: Vec<usize>,
    nodes: &[&NodeSnapshot],
    dims: &[Dim],
    rng: &mut SplitMix64,
) -> Vec<usize> {
    if items.len() <= 1 {
        return items;
    }
    let Some((dim, rest)) = dims.split_first() else {
        let mut items = items;
        rng.shuffle(&mut items);
        return items;
    };
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for item in items {
        groups.entry(dim.key(nodes[item])).or_default().push(item);
    }
    if groups.len() == 1 {
        let only = groups.into_values().flatten().collect();
        return stratified_order(only, nodes, rest, rng);
    }
    let ordered: Vec<Vec<usize>> = groups
        .into_values()
        .map(|group| stratified_order(group, nodes, rest, rng))
        .collect();
    let mut ranks: Vec<usize> = (0..ordered.len()).collect();
    rng.shuffle(&mut ranks);
    // Offsets as 32-bit fractions so positions compare exactly (no floats).
    let offsets: Vec<u128> = ordered.iter().map(|_| u128::from(rng.next_u64() >> 32)).collect();

    struct Slot {
        phase: u8,
        num: u128,
        den: u128,
        rank: usize,
        item: usize,
    }
    let mut slots: Vec<Slot> = Vec::new();
    for (g, group) in ordered.iter().enumerate() {
        let den = (group.len() as u128) << 32;
        for (j, &item) in group.iter().enumerate() {
            let phase = u8::from(j > 0);
            let num = ((j as u128) << 32) + offsets[g];
            slots.push(Slot {
                phase,
                num,
                den,
                rank: ranks[g],
                item,
            });
        }
    }
    slots.sort_by(|a, b| {
        a.phase.cmp(&b.phase).then_with(|| {
            if a.phase == 0 {
                a.rank.cmp(&b.rank)
            } else {
                // a.num / a.den vs b.num / b.den, exactly: both products
                // stay below 2^110 for any realistic fleet.
                (a.num * b.den).cmp(&(b.num * a.den)).then(a.rank.cmp(&b.rank))
            }
        })
    });
    slots.into_iter().map(|s| s.item).collect()
}
