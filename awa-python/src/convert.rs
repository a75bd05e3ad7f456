//! Conversions between Python values, SQL parameters and result rows.

use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString};
use pyo3::IntoPyObjectExt;
use serde_json::Value;
use sqlx::postgres::PgTypeKind;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Column, Postgres, Row, TypeInfo, ValueRef};

/// A Python argument of `Transaction.execute/fetch_*`, extracted while the GIL is held.
pub enum Param {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Json(Value),
    Timestamp(DateTime<Utc>),
}

impl Param {
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Param> {
        if obj.is_none() {
            return Ok(Param::Null);
        }
        if obj.is_instance_of::<PyBool>() {
            return Ok(Param::Bool(obj.extract()?));
        }
        if obj.is_instance_of::<PyInt>() {
            return obj.extract().map(Param::Int).map_err(|_| {
                crate::errors::ValidationError::new_err(format!(
                    "the SQL parameter {obj} is an integer beyond 64 bits; PostgreSQL's bigint \
                     cannot hold it (pass it as a string and cast it to numeric)"
                ))
            });
        }
        if obj.is_instance_of::<PyFloat>() {
            return Ok(Param::Float(obj.extract()?));
        }
        if obj.is_instance_of::<PyString>() {
            return Ok(Param::Text(obj.extract()?));
        }
        if obj.is_instance_of::<PyBytes>() {
            return Ok(Param::Bytes(obj.extract()?));
        }
        if let Ok(ts) = obj.extract::<DateTime<Utc>>() {
            return Ok(Param::Timestamp(ts));
        }
        if obj.is_instance_of::<PyDict>() || obj.is_instance_of::<PyList>() {
            // The package's encoder: it refuses integers beyond 64 bits and NaN (with their
            // path) instead of letting serde_json round them to floats.
            let json = obj
                .py()
                .import("awa._convert")?
                .call_method1("json_text", (obj, "the SQL parameter"))?;
            let text: String = json.extract()?;
            let value = serde_json::from_str(&text)
                .map_err(|e| crate::errors::SerializationError::new_err(e.to_string()))?;
            return Ok(Param::Json(value));
        }
        Err(crate::errors::SerializationError::new_err(format!(
            "cannot pass a {} as a SQL parameter",
            obj.get_type().name()?
        )))
    }

    pub fn bind<'q>(self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        match self {
            Param::Null => q.bind(None::<String>),
            Param::Bool(b) => q.bind(b),
            Param::Int(i) => q.bind(i),
            Param::Float(f) => q.bind(f),
            Param::Text(s) => q.bind(s),
            Param::Bytes(b) => q.bind(b),
            Param::Json(v) => q.bind(v),
            Param::Timestamp(t) => q.bind(t),
        }
    }
}

/// A decoded cell, converted to Python once the GIL is taken.
pub enum Cell {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Json(Value),
    Timestamp(DateTime<Utc>),
    Naive(NaiveDateTime),
    TextArray(Vec<String>),
    IntArray(Vec<i64>),
    BoolArray(Vec<bool>),
    FloatArray(Vec<f64>),
    Date(NaiveDate),
    Time(NaiveTime),
    /// A NUMERIC in its exact decimal text, made a `decimal.Decimal` in Python.
    Numeric(String),
}

/// Decode a result row without the GIL.
pub fn decode_row(row: &PgRow) -> Result<Vec<(String, Cell)>, String> {
    let mut out = Vec::with_capacity(row.columns().len());
    for col in row.columns() {
        let i = col.ordinal();
        let name = col.name().to_string();
        let ty = col.type_info().name().to_string();
        let is_enum = matches!(col.type_info().kind(), PgTypeKind::Enum(_));
        let cell = if is_enum {
            decode_raw(row, i, |b| {
                Ok(Cell::Text(String::from_utf8_lossy(b).into_owned()))
            })
        } else {
            decode_cell(row, i, &ty)
        }
        .map_err(|e| format!("column {name:?} ({ty}): {e}; cast it to text in the query"))?;
        out.push((name, cell));
    }
    Ok(out)
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> Cell) -> Cell {
    v.map_or(Cell::Null, f)
}

fn decode_cell(row: &PgRow, i: usize, ty: &str) -> Result<Cell, sqlx::Error> {
    Ok(match ty {
        "BOOL" => opt(row.try_get::<Option<bool>, _>(i)?, Cell::Bool),
        "INT2" => opt(row.try_get::<Option<i16>, _>(i)?, |v| Cell::Int(v.into())),
        "INT4" => opt(row.try_get::<Option<i32>, _>(i)?, |v| Cell::Int(v.into())),
        "INT8" => opt(row.try_get::<Option<i64>, _>(i)?, Cell::Int),
        "FLOAT4" => opt(row.try_get::<Option<f32>, _>(i)?, |v| Cell::Float(v.into())),
        "FLOAT8" => opt(row.try_get::<Option<f64>, _>(i)?, Cell::Float),
        "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" | "CHAR" => {
            opt(row.try_get::<Option<String>, _>(i)?, Cell::Text)
        }
        "JSON" | "JSONB" => opt(row.try_get::<Option<Value>, _>(i)?, Cell::Json),
        "TIMESTAMPTZ" => opt(row.try_get::<Option<DateTime<Utc>>, _>(i)?, Cell::Timestamp),
        "TIMESTAMP" => opt(row.try_get::<Option<NaiveDateTime>, _>(i)?, Cell::Naive),
        "BYTEA" => opt(row.try_get::<Option<Vec<u8>>, _>(i)?, Cell::Bytes),
        "TEXT[]" | "VARCHAR[]" => opt(row.try_get::<Option<Vec<String>>, _>(i)?, Cell::TextArray),
        "INT8[]" => opt(row.try_get::<Option<Vec<i64>>, _>(i)?, Cell::IntArray),
        "INT4[]" => opt(row.try_get::<Option<Vec<i32>>, _>(i)?, |v| {
            Cell::IntArray(v.into_iter().map(i64::from).collect())
        }),
        "BOOL[]" => opt(row.try_get::<Option<Vec<bool>>, _>(i)?, Cell::BoolArray),
        "FLOAT8[]" => opt(row.try_get::<Option<Vec<f64>>, _>(i)?, Cell::FloatArray),
        "DATE" => opt(row.try_get::<Option<NaiveDate>, _>(i)?, Cell::Date),
        "TIME" => opt(row.try_get::<Option<NaiveTime>, _>(i)?, Cell::Time),
        // Awa's own ids (callback ids, runtime instances, batch operations) are UUIDs.
        "UUID" => decode_raw(row, i, uuid_text)?,
        "NUMERIC" => decode_raw(row, i, numeric_text)?,
        "VOID" => Cell::Null,
        other => {
            return Err(sqlx::Error::Decode(
                format!("unsupported type {other}").into(),
            ))
        }
    })
}

/// A column read from its binary wire form (types sqlx decodes only behind features we do not
/// build: UUID, NUMERIC, enums); NULL stays NULL.
fn decode_raw(
    row: &PgRow,
    i: usize,
    f: impl FnOnce(&[u8]) -> Result<Cell, sqlx::Error>,
) -> Result<Cell, sqlx::Error> {
    let raw = row.try_get_raw(i)?;
    if raw.is_null() {
        return Ok(Cell::Null);
    }
    let bytes = raw
        .as_bytes()
        .map_err(|e| sqlx::Error::Decode(format!("not readable: {e}").into()))?;
    f(bytes)
}

fn bad(what: &str) -> sqlx::Error {
    sqlx::Error::Decode(format!("malformed {what} value").into())
}

/// A UUID's 16 bytes as its canonical lower-case text (`8-4-4-4-12`).
fn uuid_text(b: &[u8]) -> Result<Cell, sqlx::Error> {
    if b.len() != 16 {
        return Err(bad("uuid"));
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(Cell::Text(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )))
}

/// A NUMERIC's binary form (digit count, weight, sign, display scale, then base-10000
/// digits, all big-endian 16-bit) as exact decimal text: nothing is rounded through a float.
fn numeric_text(b: &[u8]) -> Result<Cell, sqlx::Error> {
    let word = |k: usize| -> Result<u16, sqlx::Error> {
        b.get(2 * k..2 * k + 2)
            .map(|w| u16::from_be_bytes([w[0], w[1]]))
            .ok_or_else(|| bad("numeric"))
    };
    let ndigits = usize::from(word(0)?);
    let weight = i64::from(word(1)? as i16);
    let sign = word(2)?;
    let dscale = usize::from(word(3)?);
    match sign {
        0xC000 => return Ok(Cell::Numeric("NaN".into())),
        0xD000 => return Ok(Cell::Numeric("Infinity".into())),
        0xF000 => return Ok(Cell::Numeric("-Infinity".into())),
        0x0000 | 0x4000 => {}
        _ => return Err(bad("numeric")),
    }
    let digits = (0..ndigits)
        .map(|k| word(4 + k))
        .collect::<Result<Vec<u16>, _>>()?;
    // Group i stands for digits[i] * 10000^(weight - i).
    let group = |i: i64| -> u16 {
        usize::try_from(i)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    if weight < 0 {
        text.push('0');
    } else {
        text.push_str(&group(0).to_string());
        for i in 1..=weight {
            text.push_str(&format!("{:04}", group(i)));
        }
    }
    if dscale > 0 {
        let mut frac = String::new();
        let groups = i64::try_from(dscale.div_ceil(4)).map_err(|_| bad("numeric"))?;
        for e in 1..=groups {
            frac.push_str(&format!("{:04}", group(weight + e)));
        }
        frac.truncate(dscale);
        text.push('.');
        text.push_str(&frac);
    }
    Ok(Cell::Numeric(text))
}

/// Convert a JSON value into Python objects.
pub fn json_to_py(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_py_any(py)?,
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_py_any(py)?
            } else if let Some(u) = n.as_u64() {
                u.into_py_any(py)?
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_py_any(py)?
            }
        }
        Value::String(s) => s.into_py_any(py)?,
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, val) in map {
                dict.set_item(k, json_to_py(py, val)?)?;
            }
            dict.into_any().unbind()
        }
    })
}

impl Cell {
    pub fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Cell::Null => py.None(),
            Cell::Bool(b) => b.into_py_any(py)?,
            Cell::Int(i) => i.into_py_any(py)?,
            Cell::Float(f) => f.into_py_any(py)?,
            Cell::Text(s) => s.into_py_any(py)?,
            Cell::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
            Cell::Json(v) => json_to_py(py, &v)?,
            Cell::Timestamp(t) => t.into_py_any(py)?,
            Cell::Naive(t) => t.into_py_any(py)?,
            Cell::TextArray(v) => v.into_py_any(py)?,
            Cell::IntArray(v) => v.into_py_any(py)?,
            Cell::BoolArray(v) => v.into_py_any(py)?,
            Cell::FloatArray(v) => v.into_py_any(py)?,
            Cell::Date(d) => d.into_py_any(py)?,
            Cell::Time(t) => t.into_py_any(py)?,
            Cell::Numeric(text) => py
                .import("decimal")?
                .getattr("Decimal")?
                .call1((text,))?
                .unbind(),
        })
    }
}

/// Rows decoded off the GIL, turned into a list of dicts with it.
pub fn rows_to_py(py: Python<'_>, rows: Vec<Vec<(String, Cell)>>) -> PyResult<Py<PyAny>> {
    let list = PyList::empty(py);
    for row in rows {
        list.append(row_to_dict(py, row)?)?;
    }
    Ok(list.into_any().unbind())
}

pub fn row_to_dict(py: Python<'_>, row: Vec<(String, Cell)>) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    for (name, cell) in row {
        dict.set_item(name, cell.into_py(py)?)?;
    }
    Ok(dict.into_any().unbind())
}
