//! `Serialize` and `Deserialize` for the generated `Key` and `Counts`, with
//! the `serde` feature.
//!
//! The derive emits `::counter_core::__derive_serde!(Key, Counts);` either
//! way; whether it expands to these impls is decided here, by counter-core's
//! own feature, so the proc macro never has to agree with it.
//!
//! A key is its stored name (`"likes"`); `Counts` is a map from stored name
//! to total, `{"likes": 3, "views": 10}`. Deserializing ignores nothing:
//! an unknown name is an error, a missing one is 0.

use std::{fmt, marker::PhantomData, str::FromStr};

use serde::{
    Deserializer, Serializer,
    de::{self, MapAccess, Visitor},
    ser::SerializeMap,
};

use crate::{CountSet, CounterError, CounterKey, KeySet};

/// Serializes a key as its stored name.
pub fn serialize_key<K: KeySet, S: Serializer>(key: &K, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(key.as_key_str())
}

/// Deserializes a key from its stored name.
pub fn deserialize_key<'de, K, D>(deserializer: D) -> Result<K, D::Error>
where
    K: KeySet + FromStr<Err = CounterError>,
    D: Deserializer<'de>,
{
    let name: std::borrow::Cow<'de, str> = serde::Deserialize::deserialize(deserializer)?;
    name.parse().map_err(de::Error::custom)
}

/// Serializes counts as a map from stored name to total, in key order.
pub fn serialize_counts<T: CountSet, S: Serializer>(
    counts: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(T::Key::ALL.len()))?;
    for &key in T::Key::ALL {
        map.serialize_entry(key.as_key_str(), &counts.get(key))?;
    }
    map.end()
}

/// Deserializes counts from a map from stored name to total.
pub fn deserialize_counts<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: CountSet,
    T::Key: FromStr<Err = CounterError>,
    D: Deserializer<'de>,
{
    struct CountsVisitor<T>(PhantomData<T>);

    impl<'de, T> Visitor<'de> for CountsVisitor<T>
    where
        T: CountSet,
        T::Key: FromStr<Err = CounterError>,
    {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map from counter key to total")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            let mut counts = T::default();
            let mut seen = Vec::with_capacity(T::Key::ALL.len());
            while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let key: T::Key = name.parse().map_err(de::Error::custom)?;
                if seen.contains(&key) {
                    return Err(de::Error::custom(format_args!(
                        "duplicate counter key {:?}",
                        key.as_key_str()
                    )));
                }
                seen.push(key);
                counts.set(key, map.next_value()?);
            }
            Ok(counts)
        }
    }

    deserializer.deserialize_map(CountsVisitor(PhantomData))
}

/// Implements `Serialize` and `Deserialize` for a generated key enum and
/// counts struct. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __derive_serde {
    ($key:ident, $counts:ident) => {
        impl $crate::__private_0_1_0::serde::Serialize for $key {
            fn serialize<S: $crate::__private_0_1_0::serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::core::result::Result<S::Ok, S::Error> {
                $crate::__private_0_1_0::serialize_key(self, serializer)
            }
        }

        impl<'de> $crate::__private_0_1_0::serde::Deserialize<'de> for $key {
            fn deserialize<D: $crate::__private_0_1_0::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::core::result::Result<Self, D::Error> {
                $crate::__private_0_1_0::deserialize_key(deserializer)
            }
        }

        impl $crate::__private_0_1_0::serde::Serialize for $counts {
            fn serialize<S: $crate::__private_0_1_0::serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::core::result::Result<S::Ok, S::Error> {
                $crate::__private_0_1_0::serialize_counts(self, serializer)
            }
        }

        impl<'de> $crate::__private_0_1_0::serde::Deserialize<'de> for $counts {
            fn deserialize<D: $crate::__private_0_1_0::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::core::result::Result<Self, D::Error> {
                $crate::__private_0_1_0::deserialize_counts(deserializer)
            }
        }
    };
}
