//! The running gateway over a real socket: bound on port 0, answers /healthz, stops on signal.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wsr_gateway::{App, Config};

#[tokio::test]
async fn serves_healthz_on_an_ephemeral_port_and_stops_on_shutdown() {
    let config = Config {
        listen: "127.0.0.1:0".parse().expect("address"),
    };
    let app = App::build(config).await.expect("gateway binds");
    let addr = app.local_addr();
    assert_ne!(addr.port(), 0, "the real port is known before serving");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));

    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .expect("send request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("read answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");

    stop.send(()).expect("server still running");
    server
        .await
        .expect("server task")
        .expect("server stops cleanly");
}
