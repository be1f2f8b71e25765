//! A BMC's firmware inventory as the database records it: one conversion
//! for inventory discovery and for the engine's read-back after a flash, so
//! both classify components and treat unparsable versions the same way.

use orchestrator_bmc::FirmwareComponent;
use orchestrator_db::model::{ComponentReading, DiscoveredComponent};

/// What an inventory read gives the database.
#[derive(Debug, Default)]
pub struct InventoryReadings {
    /// Components with a parsable version, ready to record.
    pub recorded: Vec<DiscoveredComponent>,
    /// Components without a version Waveguard can order (placeholders,
    /// vendor strings it cannot parse): not recorded, since a component
    /// whose version cannot be compared can be neither planned nor verified.
    pub unversioned: Vec<FirmwareComponent>,
}

/// Converts `inventory` into records; see [`InventoryReadings`].
pub fn inventory_readings(inventory: Vec<FirmwareComponent>) -> InventoryReadings {
    let mut out = InventoryReadings::default();
    for component in inventory {
        let Some(version) = component.parsed_version() else {
            out.unversioned.push(component);
            continue;
        };
        out.recorded.push(DiscoveredComponent {
            reading: ComponentReading {
                kind: component.kind(),
                inventory_id: component.id,
                version,
                updateable: component.updateable,
                software_id: component.software_id,
                health: component.health,
            },
            lowest_supported_version: component.lowest_supported_version,
        });
    }
    out
}
