//! Starting and stopping the gateway repeatedly never hangs: every core joins the mesh and
//! binds its listener, even when cores start while others are parked (glommio's mesh join
//! could miss that wake-up).
use crate::common;
use common::*;

#[test]
fn start_and_stop_twenty_times() {
    for _ in 0..20 {
        let server = TestServer::start();
        let mut c = server.client();
        assert_eq!(c.connect("1.2").command, "CONNECTED");
        server.stop();
    }
}
