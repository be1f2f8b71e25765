#!/usr/bin/env python3
"""sushy (OpenStack's Redfish client library) updates firmware the way an OpenStack operator's code does:
SimpleUpdate, then it waits on the DMTF task monitor named by the 202's `Location` header, then acts on
`Base.ResetRequired` with sushy's own system reset. Driven by `bmc-sim/tests/sushy.rs`, which checks the
outcome against the simulated BMC's state.

Why `get_task_monitor(Location)` and not the monitor `simple_update()` returns: sushy's
`TaskMonitor.from_response` prefers the body's `@odata.id` (the Task, which always answers 200) over
`Location`, so that monitor reports "done" at once while the update still runs. Both are reported.

Why the polling loop is written out rather than `TaskMonitor.wait()`: sushy 5.14's `sleep_for` returns a
numeric `Retry-After` header as the string it read, and `time.sleep` refuses a string, so `wait()` raises
against any service that sends `Retry-After: <seconds>` with its 202 (bmc-sim does, as DSP0266 allows).

Usage: sushy_simple_update.py URL USER IMAGE_URI [TARGET ...]; the password comes from the environment
variable SUSHY_PASSWORD so it never appears on a command line. Prints one JSON document.
"""

import json
import os
import sys
import time

import sushy

POLL_SECONDS = 0.1
TIMEOUT_SECONDS = 120


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    url, user, image_uri = sys.argv[1:4]
    targets = sys.argv[4:]
    root = sushy.Sushy(url, username=user, password=os.environ['SUSHY_PASSWORD'],
                       root_prefix='/redfish/v1/')
    updates = root.get_update_service()

    started = updates.simple_update(image_uri, targets=targets or None,
                                    transfer_protocol='HTTP')
    accepted = started.response
    location = accepted.headers.get('Location')
    if accepted.status_code != 202 or not location:
        sys.exit('SimpleUpdate answered %s with Location %r' % (accepted.status_code, location))

    monitor = root.get_task_monitor(location)
    polls_202 = 0
    states = []
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while monitor.is_processing:
        polls_202 += 1
        if monitor.task is not None:
            states.append(str(monitor.task.task_state.value if monitor.task.task_state else None))
        if time.monotonic() > deadline:
            sys.exit('task monitor %s still 202 after %ss' % (location, TIMEOUT_SECONDS))
        time.sleep(POLL_SECONDS)
        monitor.refresh()

    final = monitor.response
    task = final.json() if final.content else {}
    message_ids = [m.get('MessageId', '') for m in task.get('Messages', [])]

    resets = []
    for m in task.get('Messages', []):
        mid = m.get('MessageId', '')
        if mid.startswith('Base.') and mid.endswith('.ResetRequired'):
            resets.append({'uri': m['MessageArgs'][0], 'type': m['MessageArgs'][1]})

    # Act on ResetRequired with sushy's own resource model: the system (or manager) whose Reset
    # action the message names.
    performed = []
    for reset in resets:
        for system in root.get_system_collection().get_members():
            action = system._get_reset_action_element()
            if action.target_uri == reset['uri']:
                system.reset_system(sushy.ResetType(reset['type']))
                performed.append(reset['uri'])
        for manager in root.get_manager_collection().get_members():
            action = manager._get_reset_action_element()
            if action.target_uri == reset['uri']:
                manager.reset_manager(sushy.ResetType(reset['type']))
                performed.append(reset['uri'])

    print(json.dumps({
        'location': location,
        'monitor_from_response': started.task_monitor_uri,
        'polls_202': polls_202,
        'states_while_202': states,
        'final_status': final.status_code,
        'task_state': task.get('TaskState'),
        'message_ids': message_ids,
        'resets_requested': resets,
        'resets_performed': performed,
    }))


if __name__ == '__main__':
    main()
