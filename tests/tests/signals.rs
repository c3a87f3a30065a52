//! Signals never kill the agent silently: SIGHUP checks the configuration again and says
//! what it would take to apply it; SIGTERM still exits cleanly afterwards.
use std::time::Duration;

use tests::{http, Agent};

fn hangup(agent: &Agent) {
    // SAFETY: signalling the agent this test started.
    assert_eq!(unsafe { libc::kill(agent.pid() as i32, libc::SIGHUP) }, 0);
}

fn wait_log(agent: &Agent, needle: &str) {
    agent.wait_until(needle, Duration::from_secs(10), || {
        agent.log().contains(needle)
    });
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn sighup_reports_config_changes_and_never_kills() {
    let agent = Agent::start("[cache]\ntombstone_secs = 5\n");
    let config = agent.config_path().unwrap().to_path_buf();
    hangup(&agent);
    wait_log(&agent, "SIGHUP: the configuration is unchanged");
    std::fs::write(&config, "[cache]\ntombstone_secs = 9\n").unwrap();
    hangup(&agent);
    wait_log(&agent, "restart the agent to apply it");
    assert!(agent.log().contains("sections=cache"), "{}", agent.log());
    std::fs::write(&config, "[cache]\ntombstone_secs = 1e99\n").unwrap();
    hangup(&agent);
    wait_log(&agent, "the configuration does not load");
    assert_eq!(http::get(&agent.addr, "/healthz").unwrap().0, 200);
    let status = agent.stop();
    assert!(status.success(), "{status:?}");
}
