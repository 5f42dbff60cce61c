//! The `plugio` command.
fn main() {
    println!("plugio");
}
