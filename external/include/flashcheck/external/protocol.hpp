// The worker protocol's JSON (docs/external-subjects.md): its version, a
// domain (Capabilities) and a problem's fields as the handshake and the
// requests carry them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "flashcheck/core/subject.hpp"

namespace flashcheck::external {

/// The newest protocol version this flashcheck speaks, and the oldest. 2
/// added the backward pass (a request with "pass": "bwd", dO in, dQ/dK/dV
/// out, and the capability keys backward and backward_deterministic); a
/// version-1 worker still serves the forward, unchanged.
inline constexpr int kProtocolVersion = 2;
inline constexpr int kOldestProtocolVersion = 1;

/// The protocol's JSON form of a domain, and back. from_json throws
/// std::runtime_error naming the key on an unknown key or a bad value;
/// `deviations` receives the text that Capabilities::known_deviations views.
/// `protocol` is the version the worker speaks: the backward keys need 2.
nlohmann::json to_json(const Capabilities& caps);
Capabilities capabilities_from_json(const nlohmann::json& json, std::string& deviations,
                                    int protocol = kProtocolVersion);

/// The problem's fields as the protocol sends them beside its line.
nlohmann::json problem_fields(const Problem& problem);

}  // namespace flashcheck::external
