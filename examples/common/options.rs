//! The one command-line parser of the examples and the benchmarks (`benches/common` includes
//! this file): options are `--name value` pairs, each taken out by name, and whatever is left
//! when all are taken is an error, so that a misspelled option stops the program instead of
//! leaving it to run on a default.

use std::fmt::Display;
use std::str::FromStr;

/// Command-line options as `--name value` pairs; what is left over is an error. An option given
/// more than once takes its last value (`make bench BENCH_ARGS="--out DIR"` overrides the
/// Makefile's own `--out`).
pub struct Options(Vec<String>);

impl Options {
    /// The program's arguments, less `cargo bench`'s `--bench` (see [`Options::from_args`]).
    pub fn from_env() -> Self {
        Self::from_args(std::env::args().skip(1))
    }

    /// `args`, less any bare `--bench`: `cargo bench` adds one to every benchmark's arguments
    /// (it tells libtest's harness to benchmark), and ours, with `harness = false`, have no use
    /// for it.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Self {
        Self(args.into_iter().filter(|arg| arg != "--bench").collect())
    }

    /// Takes `--name value` out of the options (every time it is given; the last value counts).
    pub fn take(&mut self, name: &str) -> Result<Option<String>, String> {
        let mut value = None;
        while let Some(at) = self.0.iter().position(|arg| arg == name) {
            if at + 1 >= self.0.len() {
                return Err(format!("{name} needs a value"));
            }
            value = Some(self.0.remove(at + 1));
            self.0.remove(at);
        }
        Ok(value)
    }

    /// Takes `--name value` out of the options; an error if it is not there.
    pub fn take_required(&mut self, name: &str) -> Result<String, String> {
        self.take(name)?.ok_or_else(|| format!("{name} is required"))
    }

    /// Takes `--name value` out of the options, read as a `T`, if it is there.
    pub fn take_optional<T: FromStr<Err: Display>>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.take(name)?.map(|text| parse(name, &text)).transpose()
    }

    pub fn take_parsed<T: FromStr<Err: Display>>(&mut self, name: &str, default: T) -> Result<T, String> {
        Ok(self.take_optional(name)?.unwrap_or(default))
    }

    /// Takes `--name a,b,c` out of the options, each item read as a `T` (e.g. counts:
    /// `--chunks 1,2,4,8`).
    pub fn take_list<T: FromStr<Err: Display> + Clone>(
        &mut self,
        name: &str,
        default: &[T],
    ) -> Result<Vec<T>, String> {
        match self.take(name)? {
            Some(text) => text.split(',').map(|item| parse(name, item)).collect(),
            None => Ok(default.to_vec()),
        }
    }

    /// Whether `--help` or `-h` was given (taken out).
    pub fn take_help(&mut self) -> bool {
        let before = self.0.len();
        self.0.retain(|arg| arg != "--help" && arg != "-h");
        self.0.len() != before
    }

    /// Fails on anything not taken.
    pub fn finish(self) -> Result<(), String> {
        match self.0.first() {
            Some(arg) => Err(format!("unknown argument {arg:?}")),
            None => Ok(()),
        }
    }
}

/// `text`, the value of option `name`, read as a `T`.
fn parse<T: FromStr<Err: Display>>(name: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|err| format!("{name}: cannot read {text:?}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::Options;

    fn given(args: &[&str]) -> Options {
        Options::from_args(args.iter().map(|arg| arg.to_string()))
    }

    #[test]
    fn takes_options_by_name_and_the_last_of_a_repeated_one() {
        let mut options = given(&["--rows", "3", "--out", "a", "--bench", "--out", "b"]);
        assert_eq!(options.take("--out"), Ok(Some("b".into())));
        assert_eq!(options.take_parsed("--rows", 1), Ok(3));
        assert_eq!(options.take_parsed("--frames", 40), Ok(40));
        assert_eq!(options.take("--device"), Ok(None));
        assert_eq!(options.finish(), Ok(()), "cargo bench's bare --bench is dropped");
    }

    #[test]
    fn an_unknown_or_misspelled_option_is_an_error() {
        let mut options = given(&["--rowz", "3", "--frames", "4"]);
        assert_eq!(options.take_parsed("--rows", 1), Ok(1));
        assert_eq!(options.take_parsed("--frames", 40), Ok(4));
        assert_eq!(options.finish(), Err("unknown argument \"--rowz\"".into()));
        assert_eq!(
            given(&["stray"]).finish(),
            Err("unknown argument \"stray\"".into())
        );
    }

    #[test]
    fn a_missing_or_unreadable_value_is_an_error() {
        assert_eq!(given(&["--out"]).take("--out"), Err("--out needs a value".into()));
        assert_eq!(
            given(&[]).take_required("--model"),
            Err("--model is required".into())
        );
        assert_eq!(
            given(&["--frames", "many"]).take_parsed("--frames", 40),
            Err("--frames: cannot read \"many\": invalid digit found in string".into())
        );
        assert_eq!(
            given(&["--seconds", "1.5"]).take_optional::<f64>("--seconds"),
            Ok(Some(1.5))
        );
    }

    #[test]
    fn lists_are_comma_separated() {
        let mut options = given(&["--chunks", "1,4"]);
        assert_eq!(options.take_list("--chunks", &[1, 2, 4, 8]), Ok(vec![1, 4]));
        assert_eq!(options.take_list("--live", &[1, 2, 3, 4]), Ok(vec![1, 2, 3, 4]));
        assert_eq!(
            given(&["--chunks", "1,,4"]).take_list::<usize>("--chunks", &[1]),
            Err("--chunks: cannot read \"\": cannot parse integer from empty string".into())
        );
    }
}
