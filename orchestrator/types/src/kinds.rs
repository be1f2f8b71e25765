//! Closed sets of domain values, with the text form used in the database,
//! the API, CSV imports and policies.

/// A value outside one of the closed sets below.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of: {expected}")]
pub struct ParseEnumError {
    /// Which set was expected.
    pub what: &'static str,
    /// What was given.
    pub value: String,
    /// The accepted spellings, comma-separated.
    pub expected: &'static str,
}

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vdoc])* $variant),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable text form.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::ParseEnumError;
            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::ParseEnumError {
                        what: $what,
                        value: s.to_owned(),
                        expected: concat!($($text, ", "),+).trim_end_matches(", "),
                    }),
                }
            }
        }
    };
}

pub(crate) use text_enum;

text_enum!(
    /// What a firmware image is for. HGX baseboards list GPU, NVSwitch,
    /// retimer and FPGA firmware separately; the less common ones are
    /// `other` until a policy needs to tell them apart.
    ComponentKind, "component kind" {
        /// Baseboard management controller.
        Bmc = "bmc",
        /// GPU (VBIOS / GPU firmware).
        Gpu = "gpu",
        /// Network adapter.
        Nic = "nic",
        /// Host BIOS / UEFI.
        Bios = "bios",
        /// Complex programmable logic device.
        Cpld = "cpld",
        /// Anything else (NVSwitch, retimer, FPGA, HMC...).
        Other = "other",
    }
);

impl ComponentKind {
    /// Guesses the kind of a Redfish FirmwareInventory member from its `Id`
    /// (and `SoftwareId` when the id says nothing), by the naming vendors
    /// use: `BMC_Firmware`, `HGX_FW_GPU_3`, `BIOS`, `CPLD_0`, `NIC_Slot1`.
    /// NVSwitch, retimer, FPGA and HMC entries are `other`, so a GPU policy
    /// never matches them by accident. See [`ComponentKind::classify_component`]
    /// for ids that say nothing (HPE's `1`, OpenBMC's version hashes).
    pub fn classify_inventory_id(id: &str, software_id: Option<&str>) -> ComponentKind {
        fn classify(text: &str) -> Option<ComponentKind> {
            let upper = text.to_ascii_uppercase();
            let has = |word: &str| upper.contains(word);
            // Security and data entries that carry a GPU's or BMC's name (HGX
            // `HGX_FW_ERoT_GPU_SXM_1`, `HGX_InfoROM_GPU_SXM_1`), the HGX
            // management controller (`HGX_FW_BMC_0`) and the host BMC seen
            // from the HGX side (`HostBMC_0`) must never match a GPU or BMC
            // policy by name: flashing them with a GPU or BMC image bricks
            // the baseboard. A release reaches them only by naming the id.
            if ComponentKind::denied(text) {
                Some(ComponentKind::Other)
            } else if has("BMC") {
                Some(ComponentKind::Bmc)
            } else if has("GPU") || has("NEURON") || has("TRAINIUM") {
                // Accelerators share the `gpu` kind: a Trainium chip's
                // firmware is the accelerator firmware a GPU policy means.
                Some(ComponentKind::Gpu)
            } else if has("BIOS") || has("UEFI") {
                Some(ComponentKind::Bios)
            } else if has("CPLD") {
                Some(ComponentKind::Cpld)
            } else if has("NIC") || has("NETWORK") || has("ETHERNET") || has("CX7") {
                Some(ComponentKind::Nic)
            } else {
                None
            }
        }
        classify(id)
            .or_else(|| software_id.and_then(classify))
            .unwrap_or(ComponentKind::Other)
    }

    /// [`ComponentKind::classify_inventory_id`], then, when neither `Id` nor
    /// `SoftwareId` names the component, its `Name` (HPE iLO numbers its
    /// entries `1`, `2`... and names them `iLO 5`, `System ROM`), then what
    /// its `RelatedItem` links point at (OpenBMC ids are version hashes; its
    /// entries link to `Managers/bmc` or `Systems/system/Bios`). The deny
    /// list holds at every level: an ERoT or InfoROM stays `other` whatever
    /// names it.
    pub fn classify_component(
        id: &str,
        software_id: Option<&str>,
        name: Option<&str>,
        related_items: &[String],
    ) -> ComponentKind {
        let by_id = ComponentKind::classify_inventory_id(id, software_id);
        if by_id != ComponentKind::Other || Self::denied(id) || software_id.is_some_and(Self::denied) {
            return by_id;
        }
        if let Some(name) = name {
            let by_name = ComponentKind::classify_inventory_id(name, None);
            if by_name != ComponentKind::Other || Self::denied(name) {
                return by_name;
            }
            let upper = name.to_ascii_uppercase();
            // Vendors' names for the management controller and the host firmware.
            if ["ILO", "IDRAC", "XCC", "LIFECYCLE CONTROLLER"]
                .iter()
                .any(|w| upper.contains(w))
            {
                return ComponentKind::Bmc;
            }
            if ["SYSTEM ROM", "UEFI", "XCC BIOS"].iter().any(|w| upper.contains(w)) {
                return ComponentKind::Bios;
            }
        }
        for uri in related_items {
            let lower = uri.to_ascii_lowercase();
            let segments: Vec<&str> = lower.trim_end_matches('/').split('/').collect();
            if segments.iter().any(|s| Self::denied(s)) {
                return ComponentKind::Other;
            }
            if segments.last() == Some(&"bios") {
                return ComponentKind::Bios;
            }
            if segments.len() >= 5 && segments[3] == "managers" {
                return ComponentKind::Bmc;
            }
            if segments.contains(&"processors") && segments.last().is_some_and(|l| l.contains("gpu")) {
                return ComponentKind::Gpu;
            }
        }
        ComponentKind::Other
    }

    /// Entries that must never match a GPU or BMC policy by name (see
    /// [`ComponentKind::classify_inventory_id`]).
    fn denied(text: &str) -> bool {
        let upper = text.to_ascii_uppercase();
        [
            "EROT",
            "INFOROM",
            "HGX_FW_BMC",
            "HOSTBMC",
            "NVSWITCH",
            "RETIMER",
            "FPGA",
            "HMC",
            "PCIESWITCH",
        ]
        .iter()
        .any(|w| upper.contains(w))
    }
}

text_enum!(
    /// Whether the controller may touch a node.
    NodeState, "node state" {
        /// In service; eligible for rollouts.
        Active = "active",
        /// Taken out of rollouts by the controller or a human (bricked BMC,
        /// failed verification); needs a human to return it.
        Quarantined = "quarantined",
        /// Out of service by decision (repair, RMA).
        Maintenance = "maintenance",
    }
);

text_enum!(
    /// What a user may do. Ordered: each role includes the ones before it.
    Role, "role" {
        /// Reads everything.
        Viewer = "viewer",
        /// Starts, approves, pauses and rolls back rollouts; manages releases.
        ReleaseManager = "release_manager",
        /// Manages users and everything else.
        Admin = "admin",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hgx_security_data_and_management_entries_are_never_gpu_or_bmc() {
        for id in [
            "HGX_FW_ERoT_GPU_SXM_1",
            "HGX_InfoROM_GPU_SXM_8",
            "HGX_FW_ERoT_BMC_0",
            "HGX_FW_BMC_0",
            "HostBMC_0",
            "HGX_FW_ERoT_NVSwitch_0",
        ] {
            assert_eq!(
                ComponentKind::classify_inventory_id(id, None),
                ComponentKind::Other,
                "{id}"
            );
        }
        for (id, kind) in [
            ("HGX_FW_GPU_SXM_1", ComponentKind::Gpu),
            ("HGX_FW_GPU_0", ComponentKind::Gpu),
            ("BMC_Firmware", ComponentKind::Bmc),
        ] {
            assert_eq!(ComponentKind::classify_inventory_id(id, None), kind, "{id}");
        }
    }

    #[test]
    fn text_forms_round_trip() {
        for kind in ComponentKind::ALL {
            assert_eq!(kind.as_str().parse::<ComponentKind>(), Ok(*kind));
        }
        for state in NodeState::ALL {
            assert_eq!(state.as_str().parse::<NodeState>(), Ok(*state));
        }
        assert_eq!(" GPU ".parse::<ComponentKind>(), Ok(ComponentKind::Gpu));
    }

    #[test]
    fn unknown_values_list_what_is_accepted() {
        let err = "fpga".parse::<ComponentKind>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown component kind \"fpga\"; expected one of: bmc, gpu, nic, bios, cpld, other"
        );
    }

    #[test]
    fn inventory_ids_are_classified_by_vendor_naming() {
        use ComponentKind::*;
        for (id, software_id, kind) in [
            ("BMC_Firmware", None, Bmc),
            ("HGX_FW_GPU_0", None, Gpu),
            ("HGX_FW_GPU_SXM_7", None, Gpu),
            ("NeuronDevice_15", None, Gpu),
            ("HGX_FW_NVSwitch_0", None, Other),
            ("HGX_FW_PCIeRetimer_3", None, Other),
            ("HGX_FW_FPGA_0", None, Other),
            ("HGX_FW_HMC_0", None, Other),
            ("BIOS", None, Bios),
            ("CPLD_0", None, Cpld),
            ("NIC_Slot1", None, Nic),
            ("Slot_3", Some("ConnectX-7 NIC"), Nic),
            ("Unknown_Thing", None, Other),
        ] {
            assert_eq!(ComponentKind::classify_inventory_id(id, software_id), kind, "{id}");
        }
    }

    #[test]
    fn ids_that_say_nothing_are_classified_by_name_then_related_item() {
        use ComponentKind::*;
        let none: &[String] = &[];
        // HPE iLO (public iLO 5 mockups): numbered entries, telling names.
        for (id, name, kind) in [
            ("1", "iLO 5", Bmc),
            ("2", "System ROM", Bios),
            ("7", "NVIDIA H100 SXM5 80GB GPU", Gpu),
            ("9", "Intelligent Platform Abstraction Data", Other),
            ("11", "HGX ERoT GPU 3", Other),
        ] {
            assert_eq!(
                ComponentKind::classify_component(id, None, Some(name), none),
                kind,
                "{name}"
            );
        }
        // Supermicro: the ids say it.
        assert_eq!(ComponentKind::classify_component("BMC", None, Some("BMC"), none), Bmc);
        assert_eq!(
            ComponentKind::classify_component("BIOS", None, Some("BIOS"), none),
            Bios
        );
        // OpenBMC: a version hash, a generic name, and the RelatedItem that says what it is.
        let related = |uri: &str| vec![uri.to_owned()];
        for (uri, kind) in [
            ("/redfish/v1/Managers/bmc", Bmc),
            ("/redfish/v1/Systems/system/Bios", Bios),
            ("/redfish/v1/Systems/system/Processors/GPU_SXM_2", Gpu),
            ("/redfish/v1/Chassis/HGX_ERoT_GPU_SXM_2", Other),
        ] {
            assert_eq!(
                ComponentKind::classify_component("a3c4f2d1", None, Some("Software Inventory"), &related(uri)),
                kind,
                "{uri}"
            );
        }
        // An id the deny list names stays other whatever the name says.
        assert_eq!(
            ComponentKind::classify_component("HGX_FW_ERoT_GPU_SXM_1", None, Some("GPU firmware"), none),
            Other
        );
    }

    #[test]
    fn roles_are_ordered_by_privilege() {
        assert!(Role::Viewer < Role::ReleaseManager && Role::ReleaseManager < Role::Admin);
    }
}
