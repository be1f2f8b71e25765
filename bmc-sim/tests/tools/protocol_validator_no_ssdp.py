#!/usr/bin/env python3
"""DMTF's redfish-protocol-validator with its SSDP discovery tests disabled, and nothing else changed.

Why a wrapper: the validator's discovery tests send SSDP M-SEARCH requests to the multicast groups
239.255.255.250 and ff02::c and it has no option to turn them off. Waveguard's tests may only talk to
127.0.0.0/8, and bmc-sim implements no SSDP anyway. So this wrapper, before the validator runs:

- replaces `service_details.test_discovery` so that every `SERV_SSDP_*` assertion is recorded as
  NOT_TESTED with the reason below (they stay visible in the report and the counts);
- replaces `utils.discover_ssdp` with a function that raises, so no other code path can send
  multicast either.

Every other assertion (protocol details, requests, responses, sessions, accounts, ETags, ...) runs
unchanged, from the installed validator's own code.

Usage: the validator's own arguments, plus `--results-json PATH` (this wrapper's; optional), where
every logged result is written as JSON `[{"result", "assertion", "method", "status", "uri", "msg"}]`
so a test can name each failure instead of only counting them.
"""

import json
import sys

from redfish_protocol_validator import console_scripts, service_details, utils
from redfish_protocol_validator.constants import Assertion, Result

REASON = ('SSDP discovery disabled by protocol_validator_no_ssdp.py: its multicast M-SEARCH would '
          'leave loopback, and the service under test implements no SSDP')

SSDP_ASSERTIONS = [a for a in Assertion if a.name.startswith('SERV_SSDP_')]


def _no_multicast(*_args, **_kwargs):
    raise RuntimeError('SSDP discovery is disabled in this run (' + REASON + ')')


def _discovery_not_tested(sut):
    for assertion in SSDP_ASSERTIONS:
        sut.log(Result.NOT_TESTED, '', '', '', assertion, REASON)


def _take_results_json(argv):
    """Removes `--results-json PATH` from argv (the validator would refuse it); returns PATH."""
    if '--results-json' not in argv:
        return None
    i = argv.index('--results-json')
    if i + 1 >= len(argv):
        sys.exit('--results-json needs a path')
    path = argv[i + 1]
    del argv[i:i + 2]
    return path


def main():
    results_path = _take_results_json(sys.argv)
    utils.discover_ssdp = _no_multicast
    service_details.test_discovery = _discovery_not_tested

    if results_path:
        summary = utils.print_summary

        def summary_and_dump(sut):
            rows = []
            for assertion, entries in sut.results.items():
                for e in entries:
                    rows.append({
                        'result': e['result'].name,
                        'assertion': assertion.name,
                        'method': str(e['method']),
                        'status': str(e['status']),
                        'uri': str(e['uri']),
                        'msg': str(e['msg']),
                    })
            with open(results_path, 'w', encoding='utf-8') as fd:
                json.dump(rows, fd, indent=1)
            summary(sut)

        # console_scripts imported `utils` as a module, so patching the attribute reaches its call.
        utils.print_summary = summary_and_dump

    console_scripts.main()


if __name__ == '__main__':
    main()
