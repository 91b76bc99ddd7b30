fn main() {
    println!("wsr-compare: work in progress");
}
