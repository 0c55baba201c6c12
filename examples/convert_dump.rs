//! Lists the tensors of a hidden-state dump: `cargo run --example convert_dump -- FILE...`.

fn main() {
    for arg in std::env::args().skip(1) {
        match hspack::convert::open_source(std::path::Path::new(&arg)) {
            Ok(src) => {
                for t in src.tensors() {
                    match src.tensor(&t.name) {
                        Ok(x) => println!(
                            "{arg}: {:?} {} {:?} {} bytes",
                            t.name,
                            t.dtype,
                            t.shape,
                            x.bytes.len()
                        ),
                        Err(e) => println!("{arg}: {:?}: error: {e}", t.name),
                    }
                }
            }
            Err(e) => println!("error: {e}"),
        }
    }
}
