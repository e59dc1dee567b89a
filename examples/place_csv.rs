//! Places the buffers of MiniMalloc CSV files and prints what each reached:
//! `cargo run --release --example place_csv -- [--capacity N] [--time-limit S] FILE...`
use std::time::Duration;

use cubepool::placement::{csv::read_csv, place, PlaceOptions, Problem};

fn main() {
    let mut options = PlaceOptions::default();
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--capacity" => options.capacity = args.next().and_then(|v| v.parse().ok()),
            "--time-limit" => {
                let secs: f64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(10.0);
                options.time_limit = Duration::from_secs_f64(secs);
            }
            _ => files.push(arg),
        }
    }
    for file in files {
        let data = match std::fs::read(&file) {
            Ok(data) => data,
            Err(error) => {
                eprintln!("{file}: {error}");
                continue;
            }
        };
        let result = read_csv(&data)
            .map_err(|e| e.to_string())
            .and_then(|csv| Problem::new(csv.buffers).map_err(|e| e.to_string()))
            .and_then(|problem| place(&problem, &options).map_err(|e| e.to_string()));
        match result {
            Ok(p) => println!(
                "{file}: height {} lower bound {} optimal {} by {} in {:.3} s",
                p.height,
                p.lower_bound,
                p.optimal,
                p.method.as_str(),
                p.elapsed.as_secs_f64()
            ),
            Err(error) => println!("{file}: {error}"),
        }
    }
}
