//! Serve an in-memory volume over iSCSI until killed, for trying initiators by hand:
//! `cargo run -p sbod-iscsi --example memtarget -- 127.0.0.1:3260 [SIZE_MIB [BLOCK_SIZE]]`
//! (target iqn.2025-01.io.sbod:mem, LUN 0).

use sbod_iscsi::{Lu, LuConfig, Server, Target};
use sbod_nbd::MemBackend;
use std::sync::Arc;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3260".into());
    let mib: u64 = args.next().map(|s| s.parse().unwrap()).unwrap_or(64);
    let bs: u32 = args.next().map(|s| s.parse().unwrap()).unwrap_or(512);
    let addr = sbod_iscsi::parse_listen(&addr, false).unwrap();
    let be = Arc::new(MemBackend::new(mib << 20));
    let iqn = sbod_iscsi::default_iqn("mem");
    let lu = Arc::new(Lu::new(
        be,
        LuConfig {
            block_size: bs,
            serial: "mem0001".into(),
            vendor: "SBOD".into(),
            product: "sbod volume".into(),
        },
        &iqn,
    ));
    let t = Target {
        iqn,
        alias: Some("mem".into()),
        lu,
        chap: None,
        initiators: vec![],
    };
    Server::new(vec![t])
        .serve(&[addr], async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .unwrap();
}
