//! The running gateway over a real socket: bound on port 0, answers /healthz, stops on signal.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::spawn_app;

#[tokio::test]
async fn serves_healthz_on_an_ephemeral_port_and_stops_on_shutdown() {
    let app = spawn_app().await;
    assert_ne!(app.addr.port(), 0, "the real port is known before serving");
    let mut conn = TcpStream::connect(app.addr).await.expect("connect");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .expect("send request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("read answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");
    app.stop().await;
}
